--[[
  Append sub-requests to a job stream. ARGV from `first` on holds pairs
  (type, payload); the i-th pair gets index `base + i - 1`.
  The caller bounds the number of pairs (streamq sends at most ADD_CHUNK).
  A scheduled job (`due` > 0, ms) holds its sub-requests in its retry ZSET
  instead, as first attempts due at `due` ("0|<index>|<type>|<payload>"): workers
  promote them into the stream at that time, as they promote retries.
  Returns the number of entries added.
]]
local function add_entries(tasksKey, base, args, first, retryKey, due)
  local n = 0
  if due and due > 0 then
    local members = {}
    for j = first, #args, 2 do
      members[#members + 1] = due
      members[#members + 1] = "0|" .. (base + n) .. "|" .. args[j] .. "|" .. args[j + 1]
      n = n + 1
    end
    if n > 0 then rcall("ZADD", retryKey, unpack(members)) end
    return n
  end
  for j = first, #args, 2 do
    rcall("XADD", tasksKey, "*", "i", base + n, "t", args[j], "p", args[j + 1])
    n = n + 1
  end
  return n
end
