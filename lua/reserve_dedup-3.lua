--[[
  Reserve a de-duplication key for a job id, or return the job that holds it.
  Keys whose forget-after time has passed are forgotten first (at most 100
  per call). A reserved key is kept while its job runs; finish_jobs sets its
  forget-after time to completion + retention.

  Reserving also records the intent to create the job ("<job>|<dedup key>"
  in `creating`, see intend_jobs): register_jobs or finish_jobs removes it,
  the reaper finishes it when the producer died before. A call that finds
  the key held refreshes the holder's intent when it has one (its producer
  is about to create that job), so the reaper does not drop it meanwhile.

  Input:
    KEYS[1] dedup   sq:{<queue>}:dedup   HASH dedup key -> job id
    KEYS[2] dedupx  sq:{<queue>}:dedupx  ZSET dedup key -> forget-after ms
    KEYS[3] creating  sq:{<queue>}:creating  ZSET intent -> time written, ms
    ARGV[1] dedup key
    ARGV[2] job id proposed for it

  Output:
    the job id that holds the key (ARGV[2] when this call reserved it)
]]
local rcall = redis.call
local dedupKey, dedupxKey, creatingKey = KEYS[1], KEYS[2], KEYS[3]

--- @include "includes/now_ms"

local nowMs = now_ms()
local expired = rcall("ZRANGEBYSCORE", dedupxKey, "-inf", nowMs, "LIMIT", 0, 100)
for _, k in ipairs(expired) do
  rcall("HDEL", dedupKey, k)
  rcall("ZREM", dedupxKey, k)
end

local holder = rcall("HGET", dedupKey, ARGV[1])
if holder then
  rcall("ZADD", creatingKey, "XX", nowMs, holder .. "|" .. ARGV[1])
  return holder
end
rcall("HSET", dedupKey, ARGV[1], ARGV[2])
rcall("ZADD", dedupxKey, "+inf", ARGV[1])
rcall("ZADD", creatingKey, nowMs, ARGV[2] .. "|" .. ARGV[1])
return ARGV[2]
