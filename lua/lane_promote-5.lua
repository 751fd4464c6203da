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
  entry, before an entry goes back into it.

  Output:
    {moved, ms until the lane's next retry is due (0: due now), or -1 when none waits}
]]
local rcall = redis.call
local retryKey, laneKey, retriesKey, wakeKey, lanesKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5]
local member = "lane|" .. ARGV[2]

--- @include "includes/now_ms"

local nowMs = now_ms()
local moved = 0
local due = rcall("ZRANGEBYSCORE", retryKey, "-inf", nowMs, "LIMIT", 0, tonumber(ARGV[1]))
if #due > 0 and rcall("EXISTS", laneKey) == 0 then
  rcall("XGROUP", "CREATE", laneKey, ARGV[4], "0", "MKSTREAM")
  rcall("ZADD", lanesKey, tonumber(string.match(ARGV[2], "^(%d+)|")), ARGV[2])
end
for _, m in ipairs(due) do
  local a, job, c, t, p = string.match(m, "^(%d+)|([^|,]+),?([^|]*)|(%a)(.*)$")
  if a and c ~= "" then
    rcall("XADD", laneKey, "*", "j", job, "t", t, "p", p, "a", a, "s", 1, "c", c)
    moved = moved + 1
  elseif a then
    rcall("XADD", laneKey, "*", "j", job, "t", t, "p", p, "a", a, "s", 1)
    moved = moved + 1
  end
  rcall("ZREM", retryKey, m)
end
if moved > 0 and rcall("LLEN", wakeKey) < tonumber(ARGV[3]) then
  rcall("LPUSH", wakeKey, "1")
end
local nextDue = rcall("ZRANGE", retryKey, 0, 0, "WITHSCORES")
if #nextDue == 0 then
  rcall("ZREM", retriesKey, member)
  return {moved, -1}
end
rcall("ZADD", retriesKey, nextDue[2], member)
return {moved, math.max(0, tonumber(nextDue[2]) - nowMs)}
