--[[
  Finish terminal jobs in their queue: each job's single completion. The
  first call for a job records it in `finished`, removes it from the
  registry, appends one completion record to the events stream, publishes it
  once on the job's channel and on the queue's channel, and removes the job's
  tokens. Every later call finds the job in `finished` and does nothing for
  it. A worker finishes every job one batch of acknowledgements completed in
  one call.

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
    ARGV[1]  now, ms since the epoch
    ARGV[2]  cap on the events stream length (approximate)
    ARGV[3]  queue channel
    ARGV[4]  job channel prefix (a job's channel is the prefix followed by its id)
    ARGV[5..] groups of 9 per job:
             job id, terminal state (succeeded | partial | failed | aborted),
             total sub-requests, done (acknowledged with a result), failed
             (dead-lettered), retention ms, concurrency (number of tokens the
             job has), dedup key ("" for none), the completion as a JSON
             document (the published message)

  Output:
    one code per job: 1 this call finished the job; 0 it was finished already.
    `finished` entries and events older than the longest retention of the jobs
    finished here are trimmed, and the events stream is capped.
]]
local rcall = redis.call
local activeKey, finishedKey, eventsKey = KEYS[1], KEYS[2], KEYS[3]
local tokensKey, readyKey, leasedKey, parkedKey, ownersKey, kickKey, dedupxKey =
  KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local nowMs, queueChannel, jobChannel = tonumber(ARGV[1]), ARGV[3], ARGV[4]

--- @include "includes/chunked"

local out, toks, keep = {}, {}, -1
for j = 5, #ARGV, 9 do
  local job, retentionMs = ARGV[j], tonumber(ARGV[j + 5])
  if rcall("ZADD", finishedKey, "NX", ARGV[1], job) == 0 then
    out[#out + 1] = 0
  else
    out[#out + 1] = 1
    if retentionMs > keep then keep = retentionMs end
    rcall("ZREM", activeKey, job)
    rcall("XADD", eventsKey, "*", "job", job, "state", ARGV[j + 1], "total", ARGV[j + 2],
      "done", ARGV[j + 3], "failed", ARGV[j + 4], "finished", ARGV[1])
    rcall("PUBLISH", jobChannel .. job, ARGV[j + 8])
    rcall("PUBLISH", queueChannel, ARGV[j + 8])
    for i = 0, tonumber(ARGV[j + 6]) - 1 do
      toks[#toks + 1] = job .. "#" .. i
    end
    if ARGV[j + 7] ~= "" then
      rcall("ZADD", dedupxKey, nowMs + retentionMs, ARGV[j + 7])
    end
  end
end

if keep >= 0 then
  -- a token is in exactly one of leased (with an owner), ready and parked; removing
  -- every token from each is one command per structure for the whole batch
  chunked("HDEL", tokensKey, toks)
  chunked("HDEL", kickKey, toks)
  chunked("HDEL", ownersKey, toks)
  chunked("ZREM", leasedKey, toks)
  chunked("ZREM", readyKey, toks)
  chunked("ZREM", parkedKey, toks)
  rcall("ZREMRANGEBYSCORE", finishedKey, "-inf", "(" .. (nowMs - keep))
  rcall("XTRIM", eventsKey, "MINID", nowMs - keep)
  rcall("XTRIM", eventsKey, "MAXLEN", "~", ARGV[2])
end
return out
