--[[
  Reserve a de-duplication key for a job id, or return the job that holds it.
  Keys whose forget-after time has passed are forgotten first (at most 100
  per call). A reserved key is kept while its job runs; finish_jobs sets its
  forget-after time to completion + retention.

  Input:
    KEYS[1] dedup   sq:{<queue>}:dedup   HASH dedup key -> job id
    KEYS[2] dedupx  sq:{<queue>}:dedupx  ZSET dedup key -> forget-after ms
    ARGV[1] dedup key
    ARGV[2] job id proposed for it

  Output:
    the job id that holds the key (ARGV[2] when this call reserved it)
]]
local rcall = redis.call
local dedupKey, dedupxKey = KEYS[1], KEYS[2]

--- @include "includes/now_ms"

local expired = rcall("ZRANGEBYSCORE", dedupxKey, "-inf", now_ms(), "LIMIT", 0, 100)
for _, k in ipairs(expired) do
  rcall("HDEL", dedupKey, k)
  rcall("ZREM", dedupxKey, k)
end

local holder = rcall("HGET", dedupKey, ARGV[1])
if holder then return holder end
rcall("HSET", dedupKey, ARGV[1], ARGV[2])
rcall("ZADD", dedupxKey, "+inf", ARGV[1])
return ARGV[2]
