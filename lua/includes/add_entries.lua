--[[
  Append sub-requests to a job stream. ARGV from `first` on holds pairs
  (type, payload); the i-th pair gets index `base + i - 1`.
  The caller bounds the number of pairs (streamq sends at most ADD_CHUNK).
  Returns the number of entries added.
]]
local function add_entries(tasksKey, base, args, first)
  local n = 0
  for j = first, #args, 2 do
    rcall("XADD", tasksKey, "*", "i", base + n, "t", args[j], "p", args[j + 1])
    n = n + 1
  end
  return n
end
