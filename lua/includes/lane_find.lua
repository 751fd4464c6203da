--[[
  Where a small job's one sub-request is in its lane (streamq.lane):

  lane_entries_of(lane, job): the entries ({id, fields}) of `job` in lane stream
  `lane`, scanned 1,000 at a time (a lane stream holds its unsettled entries only).

  lane_retries_of(retryKey, job): the members of the lane's retry set that are
  retries of `job`: "<attempts>|<job>|<type><payload>" or, carrying a trace
  context, "<attempts>|<job>,<context>|<type><payload>".
]]
local function lane_entries_of(lane, job)
  local out, start = {}, "-"
  while true do
    local got = rcall("XRANGE", lane, start, "+", "COUNT", 1000)
    for _, e in ipairs(got) do
      local fields = e[2]
      for k = 1, #fields, 2 do
        if fields[k] == "j" and fields[k + 1] == job then out[#out + 1] = e end
      end
    end
    if #got < 1000 then return out end
    start = "(" .. got[#got][1]
  end
end

local function lane_retries_of(retryKey, job)
  local out = {}
  for _, member in ipairs(rcall("ZRANGE", retryKey, 0, -1)) do
    local sep = string.find(member, "|", 1, true)
    local head = sep and string.sub(member, sep + 1, sep + #job + 1)
    if head == job .. "|" or head == job .. "," then out[#out + 1] = member end
  end
  return out
end
