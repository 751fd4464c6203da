--[[
  Move sub-requests whose retry is due back into the job's stream, as new
  entries carrying their attempt count.

  Input:
    KEYS[1] retry  sq:{<job>}:retry  ZSET "<attempts>|<index>|<type>|<payload>" -> due ms
    KEYS[2] tasks  sq:{<job>}:tasks  STREAM
    KEYS[3] meta   sq:{<job>}:meta   HASH
    ARGV[1] now, ms since the epoch
    ARGV[2] most entries to move in this call

  Output:
    {moved, next due ms or -1 when no retry is waiting}
]]
local rcall = redis.call
local retryKey, tasksKey, metaKey = KEYS[1], KEYS[2], KEYS[3]

local moved = 0
if rcall("EXISTS", metaKey) == 1 then
  local due = rcall("ZRANGEBYSCORE", retryKey, "-inf", ARGV[1], "LIMIT", 0, tonumber(ARGV[2]))
  for _, member in ipairs(due) do
    local a, i, t, p = string.match(member, "^(%d+)|(%d+)|(%a)|(.*)$")
    if a then
      rcall("XADD", tasksKey, "*", "i", i, "t", t, "p", p, "a", a)
      moved = moved + 1
    end
    rcall("ZREM", retryKey, member)
  end
end
local nextDue = rcall("ZRANGE", retryKey, 0, 0, "WITHSCORES")
if #nextDue == 0 then return {moved, -1} end
return {moved, tonumber(nextDue[2])}
