--[[
  The entries a call settles, read before it writes anything. A caller names each
  entry with what it holds (its job, its sub-request index, its payload); a call
  naming an entry with another job's id, another index or another payload would
  write that job's records, or a retry of a payload no one submitted, so it is
  refused first (`entry_refused`: "sq_<name>: entry <id> holds another job than the
  call names", an error of the function, past its guard).
  entries_of(stream, ids): id -> the entry's flat field list, or false for an entry
  no longer in the stream (settled before: every script that settles an entry
  deletes it); one XRANGE over the span of `ids` (a batch read at once is one run of
  the stream: at most twice its length and 16 entries are read), then one XRANGE
  for each id that span did not hold.
  field_of(flat, name): one field of such a list (nil when it has none).
]]
local function entries_of(stream, ids)
  local out = {}
  if #ids == 0 then return out end
  for _, e in ipairs(rcall("XRANGE", stream, ids[1], ids[#ids], "COUNT", 2 * #ids + 16)) do
    out[e[1]] = e[2]
  end
  for _, id in ipairs(ids) do
    if out[id] == nil then
      local one = rcall("XRANGE", stream, id, id)
      out[id] = (one[1] and one[1][2]) or false
    end
  end
  return out
end

local function field_of(flat, name)
  for k = 1, #flat, 2 do
    if flat[k] == name then return flat[k + 1] end
  end
  return nil
end

local function entry_refused(script, id, what)
  return redis.error_reply("ERR sq_" .. script .. ": entry " .. id .. " holds " .. what ..
                           " than the call names (nothing written)")
end
