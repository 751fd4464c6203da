--[[
  Move a lane's small jobs whose retry is due back into the lane stream, as
  new entries carrying their attempt count and marked suspect ("s" = 1, so
  the worker records their start and a kill inside the handler counts an
  attempt), and note when the lane's next retry is due.

  Input:
    KEYS[1] retry    sq:{<shard>}:lane:<prio>:<client>:retry  ZSET
            "<attempts>|<job>|<type><payload>" -> due ms; "<job>,<context>" for an
            entry that carries a trace context (field "c")
    KEYS[2] lane     sq:{<shard>}:lane:<prio>:<client>        STREAM
    KEYS[3] retries  sq:{<shard>}:retries  ZSET "lane|<prio>|<client>" -> due ms
    KEYS[4] wake     sq:{<shard>}:wake     LIST of wake-up signals
    KEYS[5] lanes    sq:{<shard>}:lanes    ZSET "<prio>|<client>" -> priority
    ARGV[1] most entries to move in this call
    ARGV[2] lane member "<prio>|<client>"
    ARGV[3] cap on wake-up signals
    ARGV[4] consumer group name
  A lane dropped while idle (lane_drop) is made again, group and registry
  entry, before an entry goes back into it. The move is includes/move_due,
  which promote_retries shares.

  Output:
    {moved, ms until the lane's next retry is due (0: due now), or -1 when none waits}
]]
local rcall = redis.call
local retryKey, laneKey, retriesKey, wakeKey, lanesKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5]
local member = "lane|" .. ARGV[2]

--- @include "includes/now_ms"
--- @include "includes/move_due"

local function parse(m)
  local a, job, c, t, p = string.match(m, "^(%d+)|([^|,]+),?([^|]*)|(%a)(.*)$")
  return a, job, t, c, p
end

local function ready()
  if rcall("EXISTS", laneKey) == 0 then
    rcall("XGROUP", "CREATE", laneKey, ARGV[4], "0", "MKSTREAM")
    rcall("ZADD", lanesKey, tonumber(string.match(ARGV[2], "^(%d+)|")), ARGV[2])
  end
end

local nowMs = now_ms()
local moved, nextDue = move_due(retryKey, laneKey, "j", parse, ready, nowMs, tonumber(ARGV[1]))
if moved > 0 and rcall("LLEN", wakeKey) < tonumber(ARGV[3]) then
  rcall("LPUSH", wakeKey, "1")
end
if not nextDue then
  rcall("ZREM", retriesKey, member)
  return {moved, -1}
end
rcall("ZADD", retriesKey, nextDue, member)
return {moved, math.max(0, tonumber(nextDue) - nowMs)}
