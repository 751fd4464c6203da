--[[
  Finish a terminal job in its queue: the single completion. The first call
  for a job records it in `finished`, removes it from the registry, appends
  one completion record to the events stream, publishes it once on the
  job's channel and on the queue's channel, and removes the job's tokens.
  Every later call finds the job in `finished` and does nothing.

  Input:
    KEYS[1]  active    sq:{<queue>}:active    ZSET job -> registration ms
    KEYS[2]  finished  sq:{<queue>}:finished  ZSET job -> completion ms
    KEYS[3]  events    sq:{<queue>}:events    STREAM of completion records
    KEYS[4]  tokens    sq:{<queue>}:tokens    HASH token -> score
    KEYS[5]  ready     sq:{<queue>}:ready     ZSET
    KEYS[6]  leased    sq:{<queue>}:leased    ZSET
    KEYS[7]  parked    sq:{<queue>}:parked    ZSET
    KEYS[8]  owners    sq:{<queue>}:owners    HASH
    KEYS[9]  kick      sq:{<queue>}:kick      HASH
    KEYS[10] dedupx    sq:{<queue>}:dedupx    ZSET dedup key -> forget-after ms
    ARGV[1]  job id
    ARGV[2]  terminal state (succeeded | partial | failed | aborted)
    ARGV[3]  total sub-requests
    ARGV[4]  done (acknowledged with a result)
    ARGV[5]  failed (dead-lettered)
    ARGV[6]  now, ms since the epoch
    ARGV[7]  retention, ms (finished jobs and events older than this are trimmed)
    ARGV[8]  cap on the events stream length (approximate)
    ARGV[9]  concurrency (number of tokens the job has)
    ARGV[10] dedup key, "" for none
    ARGV[11] job channel
    ARGV[12] queue channel
    ARGV[13] the completion as a JSON document (the published message)

  Output:
    1 this call finished the job; 0 it was finished already
]]
local rcall = redis.call
local activeKey, finishedKey, eventsKey = KEYS[1], KEYS[2], KEYS[3]
local tokensKey, readyKey, leasedKey, parkedKey, ownersKey, kickKey, dedupxKey =
  KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local job, nowMs, retentionMs = ARGV[1], tonumber(ARGV[6]), tonumber(ARGV[7])

if rcall("ZSCORE", finishedKey, job) then
  return 0
end

rcall("ZADD", finishedKey, nowMs, job)
rcall("ZREMRANGEBYSCORE", finishedKey, "-inf", "(" .. (nowMs - retentionMs))
rcall("ZREM", activeKey, job)
rcall("XADD", eventsKey, "MINID", nowMs - retentionMs, "*",
  "job", job, "state", ARGV[2], "total", ARGV[3], "done", ARGV[4], "failed", ARGV[5],
  "finished", ARGV[6])
rcall("XTRIM", eventsKey, "MAXLEN", "~", ARGV[8])
rcall("PUBLISH", ARGV[11], ARGV[13])
rcall("PUBLISH", ARGV[12], ARGV[13])

-- a token is in exactly one of leased, ready and parked: look no further than
-- the set that held it
for i = 0, tonumber(ARGV[9]) - 1 do
  local tok = job .. "#" .. i
  rcall("HDEL", tokensKey, tok)
  rcall("HDEL", kickKey, tok)
  if rcall("ZREM", leasedKey, tok) == 1 then
    rcall("HDEL", ownersKey, tok)  -- an owner only while leased
  elseif rcall("ZREM", readyKey, tok) == 0 then
    rcall("ZREM", parkedKey, tok)
  end
end
if ARGV[10] ~= "" then
  rcall("ZADD", dedupxKey, nowMs + retentionMs, ARGV[10])
end
return 1
