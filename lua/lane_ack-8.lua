--[[
  Acknowledge small jobs (streamq.lane) and complete them, in one call: for
  each entry XACK acknowledged, its result is stored, the job's record turns
  succeeded and its completion is recorded and published once. An entry XACK
  did not acknowledge (settled before: a resent call, or reclaimed from a
  worker presumed dead) changes nothing. Acknowledged entries are deleted.
  Finished jobs whose retention passed are forgotten (a bounded number per call).

  Input:
    KEYS[1] lane     sq:{<shard>}:lane:<prio>:<client>  STREAM
    KEYS[2] ljobs    sq:{<shard>}:ljobs     HASH job -> JSON record
    KEYS[3] lresults sq:{<shard>}:lresults  HASH job -> encoded result
    KEYS[4] lerrors  sq:{<shard>}:lerrors   HASH job -> JSON error record
    KEYS[5] lstarts  sq:{<shard>}:lstarts   HASH entry id -> consumer
    KEYS[6] lactive  sq:{<shard>}:lactive   ZSET job -> submit ms
    KEYS[7] ldone    sq:{<shard>}:ldone     ZSET job -> forget-after ms
    KEYS[8] events   sq:{<shard>}:events    STREAM of completion records
    ARGV[1] consumer group name
    ARGV[2] cap on the events stream length (approximate)
    ARGV[3] events retention, ms
    ARGV[4] queue channel
    ARGV[5] job channel prefix
    ARGV[6] publish command (PUBLISH, or SPUBLISH on a Redis Cluster)
    ARGV[7] queue name (in the published completion)
    ARGV[8..] triples (entry id, job id, encoded result)

  Output:
    {acknowledged, completed}: entries this call acknowledged, jobs it completed
]]
local rcall = redis.call
local ctx = {lane = KEYS[1], ljobs = KEYS[2], lresults = KEYS[3], lerrors = KEYS[4],
             lstarts = KEYS[5], lactive = KEYS[6], ldone = KEYS[7], events = KEYS[8],
             eventsMax = ARGV[2], eventsRetention = ARGV[3], queueChannel = ARGV[4],
             jobChannel = ARGV[5], publish = ARGV[6], queue = ARGV[7]}
local group = ARGV[1]

--- @include "includes/now_ms"
--- @include "includes/chunked"
--- @include "includes/lane_complete"

local nowMs = now_ms()
local acked, completed, ids = 0, 0, {}
local starts = rcall("EXISTS", ctx.lstarts) == 1
for j = 8, #ARGV, 3 do
  local id, job = ARGV[j], ARGV[j + 1]
  if rcall("XACK", ctx.lane, group, id) == 1 then
    acked = acked + 1
    ids[#ids + 1] = id
    local raw = rcall("HGET", ctx.ljobs, job)
    if raw then
      local rec = cjson.decode(raw)
      if rec["state"] == "active" then
        rcall("HSET", ctx.lresults, job, ARGV[j + 2])
        lane_complete(ctx, job, rec, "succeeded", 1, 0, nowMs)
        completed = completed + 1
      end
    end
  end
end
chunked("XDEL", ctx.lane, ids)
if starts then chunked("HDEL", ctx.lstarts, ids) end
lane_trim(ctx, nowMs, 100)
return {acked, completed}
