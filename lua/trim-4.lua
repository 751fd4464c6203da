--[[
  Forget what a queue keeps only for a while, by Redis's clock, in one call:
  - dedup keys whose forget-after time has passed (score <= now), from both
    the map and its expiry index: a key reserved again meanwhile has score
    +inf and is never among them;
  - `finished` entries whose score has passed: a `finished` score is the
    time its job's guard against a second finish may be dropped (the finish
    time plus the job's own retention), so the cut-off is now, whatever
    retention any caller has;
  - completion records (events) older than now - retention.
  Dedup keys and `finished` entries are bounded per call; the reply says
  whether more is due, so the caller may call again.

  Input:
    KEYS[1] events    sq:{<queue>}:events    STREAM of completion records (ids: Redis time)
    KEYS[2] finished  sq:{<queue>}:finished  ZSET job -> time its guard may be dropped, ms
    KEYS[3] dedup     sq:{<queue>}:dedup     HASH dedup key -> job id
    KEYS[4] dedupx    sq:{<queue>}:dedupx    ZSET dedup key -> forget-after ms
    ARGV[1] events retention, ms
    ARGV[2] most dedup keys and most `finished` entries removed in this call

  Output:
    {dedup keys forgotten, `finished` entries removed, events removed,
     1 when a limit was reached (more is due) else 0}
]]
local rcall = redis.call
local eventsKey, finishedKey, dedupKey, dedupxKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local retentionMs, limit = tonumber(ARGV[1]), tonumber(ARGV[2])

--- @include "includes/now_ms"
--- @include "includes/chunked"

local now = now_ms()
local more = 0

local expired = rcall("ZRANGEBYSCORE", dedupxKey, "-inf", now, "LIMIT", 0, limit)
if #expired > 0 then
  chunked("HDEL", dedupKey, expired)
  chunked("ZREM", dedupxKey, expired)
  if #expired >= limit then more = 1 end
end

-- `ZREMRANGEBYSCORE finished -inf (now`, at most `limit` entries at a time
local done = rcall("ZRANGEBYSCORE", finishedKey, "-inf", "(" .. now, "LIMIT", 0, limit)
if #done > 0 then
  chunked("ZREM", finishedKey, done)
  if #done >= limit then more = 1 end
end

-- whole stream nodes below the cut-off are freed at once, the one across it edited
local events = rcall("XTRIM", eventsKey, "MINID", now - retentionMs)

return {#expired, #done, events, more}
