--[[
  Move sub-requests whose retry is due back into the job's stream, as new
  entries carrying their attempt count and marked suspect ("s" = 1): the
  worker records their start, so a kill inside the handler on a retry counts
  an attempt (the one uncounted loss is for an entry's first read only).

  Input:
    KEYS[1] retry  sq:{<job>}:retry  ZSET "<attempts>|<index>|<type>|<payload>" -> due ms;
                   "<type>,<context>" for an entry that carries a trace context (field "c")
    KEYS[2] tasks  sq:{<job>}:tasks  STREAM
    KEYS[3] meta   sq:{<job>}:meta   HASH
    ARGV[1] most entries to move in this call

  Output:
    {moved, ms until the next retry is due (0 when due now) or -1 when no retry
     is waiting, the job's concurrency (0 when its meta is gone)}: due times are
    Redis's clock, so the wait is given relative to it
]]
local rcall = redis.call
local retryKey, tasksKey, metaKey = KEYS[1], KEYS[2], KEYS[3]

--- @include "includes/now_ms"

local nowMs = now_ms()

local moved = 0
local concurrency = 0
if rcall("EXISTS", metaKey) == 1 then
  concurrency = tonumber(rcall("HGET", metaKey, "concurrency") or "0")
  local due = rcall("ZRANGEBYSCORE", retryKey, "-inf", nowMs, "LIMIT", 0, tonumber(ARGV[1]))
  for _, member in ipairs(due) do
    local a, i, t, c, p = string.match(member, "^(%d+)|(%d+)|(%a),?([^|]*)|(.*)$")
    if a and c ~= "" then
      rcall("XADD", tasksKey, "*", "i", i, "t", t, "p", p, "a", a, "s", 1, "c", c)
      moved = moved + 1
    elseif a then
      rcall("XADD", tasksKey, "*", "i", i, "t", t, "p", p, "a", a, "s", 1)
      moved = moved + 1
    end
    rcall("ZREM", retryKey, member)
  end
end
local nextDue = rcall("ZRANGE", retryKey, 0, 0, "WITHSCORES")
if #nextDue == 0 then return {moved, -1, concurrency} end
return {moved, math.max(0, tonumber(nextDue[2]) - nowMs), concurrency}
