--[[
  The job's first start, for its timeline (meta "started"): the earliest
  delivery, by Redis's clock, of the entries its workers settle. An entry's
  delivery time is now minus its idle time in the group's pending list, read
  before the entry is acknowledged. Returns that time for entry `id` (nil when
  it is not pending, or when the stream is gone: a call sent again after the one
  that completed the job, which deleted the stream, must not fail on NOGROUP),
  so the caller can keep the smaller of it and meta's.
]]
local function first_start(tasksKey, group, id, nowMs)
  if rcall("EXISTS", tasksKey) == 0 then return nil end
  local p = rcall("XPENDING", tasksKey, group, id, id, 1)
  if p[1] == nil then return nil end
  return nowMs - tonumber(p[1][3])
end
