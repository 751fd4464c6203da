--[[
  Finish terminal jobs in their queue: each job's single completion. The
  first call for a job incarnation records it in `finished`, removes the job
  from the registry, appends one completion record to the events stream,
  publishes it once on the job's channel and on the queue's channel, and
  removes the job's tokens. Every later call finds the incarnation in
  `finished` and does nothing for it. A worker finishes every job one batch
  of acknowledgements completed in one call. A job that recorded dead
  letters also enters `owed` (the marker the reaper scans for jobs that may
  still owe dead-letter announcements; it leaves once they are all in the
  dead stream). Each job's intent (intend_jobs, reserve_dedup) is removed,
  by every call: the cross-slot submit is done.

  The `finished` guard compares no clocks: its member is "<job>|<incarnation>"
  (the incarnation create_job gave the job), its score the time after which
  the guard may be dropped: Redis's clock at this finish + the job's own
  retention. A guard therefore lives exactly as long as the job's records,
  whatever the retention of other jobs, and `ZREMRANGEBYSCORE finished -inf
  (now` is the whole trim.

  Input:
    KEYS[1]  active    sq:{<queue>}:active    ZSET job -> registration ms
    KEYS[2]  finished  sq:{<queue>}:finished  ZSET "<job>|<incarnation>" -> forget-after ms
    KEYS[3]  events    sq:{<queue>}:events    STREAM of completion records
    KEYS[4]  tokens    sq:{<queue>}:tokens    HASH token -> score
    KEYS[5]  ready     sq:{<queue>}:ready     ZSET
    KEYS[6]  leased    sq:{<queue>}:leased    ZSET
    KEYS[7]  parked    sq:{<queue>}:parked    ZSET
    KEYS[8]  owners    sq:{<queue>}:owners    HASH
    KEYS[9]  kick      sq:{<queue>}:kick      HASH
    KEYS[10] dedupx    sq:{<queue>}:dedupx    ZSET dedup key -> forget-after ms
    KEYS[11] owed      sq:{<queue>}:owed      ZSET job -> finish ms, jobs with dead letters
    KEYS[12] creating  sq:{<queue>}:creating  ZSET intent -> time written, ms
    ARGV[1]  cap on the events stream length (approximate)
    ARGV[2]  events retention, ms: the queue's configured retention (records
             older than Redis's clock minus this are trimmed)
    ARGV[3..] groups of 11 per job:
             job id, terminal state (succeeded | partial | failed | aborted),
             total sub-requests, done (acknowledged with a result), failed
             (dead-lettered), retention ms, concurrency (number of tokens the
             job has), dedup key ("" for none), the completion as a JSON
             document ending with `"finished_ms":<n>}` (the published message;
             this call puts its own time in place of <n>), incarnation, dead
             letters the job recorded (meta `dead`, malformed entries and
             replayed ones included)

  Output:
    one code per job: 1 this call finished the job; 0 it was finished already.
    Expired `finished` guards are dropped; the events stream is trimmed by
    the queue's retention and capped at ARGV[1] entries.
]]
local rcall = redis.call
local activeKey, finishedKey, eventsKey = KEYS[1], KEYS[2], KEYS[3]
local tokensKey, readyKey, leasedKey, parkedKey, ownersKey, kickKey, dedupxKey, owedKey =
  KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local creatingKey = KEYS[12]
local queueChannel = sq_channel(SQ_TAG)
local jobChannel = queueChannel .. ":"

--- @include "includes/chunked"
--- @include "includes/now_ms"
--- @include "includes/int_text"

local nowMs = now_ms()
-- the clock's text, and each retention's forget-after, made once (includes/int_text)
local now, forgetAt = int_text(nowMs), {}
local out, toks, intents = {}, {}, {}
for j = 3, #ARGV, 11 do
  local job, retentionMs = ARGV[j], tonumber(ARGV[j + 5])
  local forget = forgetAt[retentionMs]
  if not forget then
    forget = int_text(nowMs + retentionMs)
    forgetAt[retentionMs] = forget
  end
  if ARGV[j + 7] == "" then
    intents[#intents + 1] = job
  else
    intents[#intents + 1] = job .. "|" .. ARGV[j + 7]
  end
  if rcall("ZADD", finishedKey, "NX", forget, job .. "|" .. ARGV[j + 9]) == 0 then
    out[#out + 1] = 0
  else
    out[#out + 1] = 1
    rcall("ZREM", activeKey, job)
    rcall("XADD", eventsKey, "*", "job", job, "state", ARGV[j + 1], "total", ARGV[j + 2],
      "done", ARGV[j + 3], "failed", ARGV[j + 4], "finished", now)
    local message = string.gsub(ARGV[j + 8], '"finished_ms":%-?%d+}$',
                                '"finished_ms":' .. now .. '}')
    sq_publish(jobChannel .. job, message)
    sq_publish(queueChannel, message)
    for i = 0, tonumber(ARGV[j + 6]) - 1 do
      toks[#toks + 1] = job .. "#" .. i
    end
    -- tokens past the concurrency it was given (a reprioritize whose second step,
    -- the meta, never ran) go too: a job's tokens are contiguous
    local extra = tonumber(ARGV[j + 6])
    while rcall("HEXISTS", tokensKey, job .. "#" .. extra) == 1 do
      toks[#toks + 1] = job .. "#" .. extra
      extra = extra + 1
    end
    if ARGV[j + 7] ~= "" then
      rcall("ZADD", dedupxKey, forget, ARGV[j + 7])
    end
    if tonumber(ARGV[j + 10]) > 0 then
      rcall("ZADD", owedKey, now, job)
    end
  end
end

if #toks > 0 then
  -- a token is in exactly one of leased (with an owner), ready and parked; removing
  -- every token from each is one command per structure for the whole batch
  chunked("HDEL", tokensKey, toks)
  chunked("HDEL", kickKey, toks)
  chunked("HDEL", ownersKey, toks)
  chunked("ZREM", leasedKey, toks)
  chunked("ZREM", readyKey, toks)
  chunked("ZREM", parkedKey, toks)
end
chunked("ZREM", creatingKey, intents)
rcall("ZREMRANGEBYSCORE", finishedKey, "-inf", "(" .. nowMs)
rcall("XTRIM", eventsKey, "MINID", nowMs - tonumber(ARGV[2]))
rcall("XTRIM", eventsKey, "MAXLEN", "~", ARGV[1])
return out
