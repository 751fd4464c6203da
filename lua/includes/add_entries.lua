--[[
  Append sub-requests to a job stream. ARGV from `first` on holds pairs
  (type, payload); the i-th pair gets index `base + i - 1`.
  The caller bounds the number of pairs (streamq sends at most ADD_CHUNK).
  A scheduled job (`due` > 0, ms) holds its sub-requests in its retry ZSET
  instead, as first attempts due at `due` ("0|<index>|<type>|<payload>"): workers
  promote them into the stream at that time, as they promote retries.
  An odd number of arguments from `first` on ends in a trace context (a W3C
  traceparent, streamq.tracing): each entry carries it in field "c" (a scheduled
  one in its member, "0|<index>|<type>,<context>|<payload>").
  Returns the number of entries added.
]]
local function add_entries(tasksKey, base, args, first, retryKey, due)
  local n = 0
  local last, ctx = #args, nil
  if (last - first + 1) % 2 == 1 then
    ctx = args[last]
    last = last - 1
  end
  if due and due > 0 then
    local members = {}
    local mark = ""
    if ctx then mark = "," .. ctx end
    for j = first, last, 2 do
      members[#members + 1] = due
      members[#members + 1] = "0|" .. (base + n) .. "|" .. args[j] .. mark .. "|" .. args[j + 1]
      n = n + 1
    end
    if n > 0 then rcall("ZADD", retryKey, unpack(members)) end
    return n
  end
  for j = first, last, 2 do
    if ctx then
      rcall("XADD", tasksKey, "*", "i", base + n, "t", args[j], "p", args[j + 1], "c", ctx)
    else
      rcall("XADD", tasksKey, "*", "i", base + n, "t", args[j], "p", args[j + 1])
    end
    n = n + 1
  end
  return n
end
