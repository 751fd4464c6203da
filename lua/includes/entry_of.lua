--[[
  The entry a call settles, read before it writes anything. A failure names its
  entry with what it holds (its job, its sub-request index, its type and payload: a
  retry and a dead letter are made of them); a call naming it with another job's
  id, another index or another payload would write that job's records, or a retry
  of a payload no one submitted, so it is refused first (`entry_refused`: "sq_<name>:
  entry <id> holds another job than the call names", an error of the function, past
  its guard).
  entry_of(stream, id): the entry's flat field list, or false for an entry no
  longer in the stream (settled before: every script that settles an entry deletes
  it).
  field_of(flat, name): one field of such a list (nil when it has none).
]]
local function entry_of(stream, id)
  local got = rcall("XRANGE", stream, id, id)
  return (got[1] and got[1][2]) or false
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
