--[[
  Move sub-requests whose retry is due back into the job's stream, as new
  entries carrying their attempt count and marked suspect ("s" = 1): the
  worker records their start, so a kill inside the handler on a retry counts
  an attempt (the one uncounted loss is for an entry's first read only).
  The move is includes/move_due, which lane_promote shares.

  Input:
    KEYS[1] retry  sq:{<queue>/<job>}:retry  ZSET "<attempts>|<index>|<type>|<payload>" -> due ms;
                   "<type>,<context>" for an entry that carries a trace context (field "c")
    KEYS[2] tasks  sq:{<queue>/<job>}:tasks  STREAM
    KEYS[3] meta   sq:{<queue>/<job>}:meta   HASH
    ARGV[1] most entries to move in this call

  Output:
    {moved, ms until the next retry is due (0 when due now) or -1 when no retry
     is waiting, the job's concurrency (0 when its meta is gone)}: due times are
    Redis's clock, so the wait is given relative to it
]]
local rcall = redis.call
local retryKey, tasksKey, metaKey = KEYS[1], KEYS[2], KEYS[3]

--- @include "includes/now_ms"
--- @include "includes/move_due"

local function parse(member)
  local a, i, t, c, p = string.match(member, "^(%d+)|(%d+)|(%a),?([^|]*)|(.*)$")
  return a, i, t, c, p
end

local nowMs = now_ms()
local moved, nextDue, concurrency = 0, nil, 0
if rcall("EXISTS", metaKey) == 1 then
  concurrency = tonumber(rcall("HGET", metaKey, "concurrency") or "0")
  moved, nextDue = move_due(retryKey, tasksKey, "i", parse, function() end, nowMs,
                            tonumber(ARGV[1]))
else
  nextDue = rcall("ZRANGE", retryKey, 0, 0, "WITHSCORES")[2]
end
if not nextDue then return {moved, -1, concurrency} end
return {moved, math.max(0, tonumber(nextDue) - nowMs), concurrency}
