--[[
  Create a job in its own hash slot: meta hash, task stream with its consumer
  group, and the first sub-requests. Creating a job id that exists changes
  nothing and describes the existing job. Idempotent by the incarnation the
  caller draws per call (ARGV[6], stored in meta): when the existing job
  carries this call's incarnation, the call was applied before and its reply
  lost; it replies as the creator (created 1), and, when the job is terminal
  (an empty job finalized at once), with completed 1 so that the caller still
  finishes it (finish_jobs does that once).

  Input:
    KEYS[1] meta     sq:{<queue>/<job>}:meta     HASH
    KEYS[2] tasks    sq:{<queue>/<job>}:tasks    STREAM (+ consumer group ARGV[10])
    KEYS[3] results  sq:{<queue>/<job>}:results  HASH
    KEYS[4] errors   sq:{<queue>/<job>}:errors   HASH
    KEYS[5] dlq      sq:{<queue>/<job>}:dlq      HASH dead-letter payloads (expire with the job)
    KEYS[6] retry    sq:{<queue>/<job>}:retry    ZSET a scheduled job's sub-requests, due at its time
    ARGV[1]  queue name
    ARGV[2]  priority (0..99, 0 most urgent)
    ARGV[3]  concurrency (tokens)
    ARGV[4]  client name (fairness)
    ARGV[5]  max deliveries per sub-request
    ARGV[6]  incarnation: a random id the caller draws for this create; stored
             when this call creates the job; when the job exists, it tells this
             call's own resend (same incarnation) from another create (the
             reply carries the job's own). A job id reused after its records
             expired gets a new one, which is how the queue's hash slot tells the new
             job from the finished old one without comparing clocks
    ARGV[7]  retention after completion, ms
    ARGV[8]  dedup key, "" for none
    ARGV[9]  mode: "final" to finalize at once (a plain submit), "open" to leave the
             job open (streaming), "submit" for a plain submit whose client adds
             more sub-requests and then finalizes (stored in meta `mode`, so a
             retried submit can resume it)
    ARGV[10] consumer group name
    ARGV[11] when the sub-requests become ready: "" now; "+<ms>" that long from now;
             "@<ms since the epoch>" at that time (both by Redis's clock). A scheduled
             job stores the time in meta `due` and its sub-requests in its retry ZSET
             (see includes/add_entries); its queue registers it parked, due then
    ARGV[12] the handler timeout of each sub-request, ms; "0" for none (stored in
             meta `timeout` only when set)
    ARGV[13..] pairs (type, payload) of sub-requests, indexes 0, 1, ...; an odd
             count ends in a trace context the entries carry (includes/add_entries)

  Output:
    {created (1 new | 0 existing), queue, then the job_reply fields:
     completed (0|1), state, total, done, failed, concurrency, dedup, priority,
     client, created, retention, incarnation, dead letters, due}
    ERR_AT_PAST (-9) when "@<ms>" is already past (nothing is created)
    `created` is Redis's clock at creation, ms since the epoch.
    `completed` is 1 when this call made the job terminal (an empty job
    finalized at once): the caller must then finish it in the queue's hash slot.
]]
local rcall = redis.call
local metaKey, tasksKey, resultsKey, errorsKey, dlqKey, retryKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local incarnation, retentionMs = ARGV[6], ARGV[7]
local finalize = ARGV[9] == "final"

--- @include "includes/now_ms"
--- @include "includes/errors"
--- @include "includes/job_reply"
--- @include "includes/add_entries"
--- @include "includes/complete_job"

local function reply(created, completed)
  local r = job_reply(metaKey, completed)
  table.insert(r, 1, rcall("HGET", metaKey, "queue") or "")
  table.insert(r, 1, created)
  return r
end

local existing = rcall("HMGET", metaKey, "state", "incarnation")
if existing[1] then
  if incarnation ~= "" and existing[2] == incarnation then
    -- this call's own create, sent again after its reply was lost
    local completed = 0
    if existing[1] ~= "open" and existing[1] ~= "active" then completed = 1 end
    return reply(1, completed)
  end
  return reply(0, 0)
end

local nowMs = now_ms()
local due = 0
local when = ARGV[11]
if string.sub(when, 1, 1) == "+" then
  due = nowMs + tonumber(string.sub(when, 2))
elseif string.sub(when, 1, 1) == "@" then
  due = tonumber(string.sub(when, 2))
  if due < nowMs then return ERR_AT_PAST end
end
if due <= nowMs then due = 0 end  -- due now: an ordinary job
rcall("XGROUP", "CREATE", tasksKey, ARGV[10], "0", "MKSTREAM")
local n = add_entries(tasksKey, 0, ARGV, 13, retryKey, due)
local remaining = n
local state = "active"
if not finalize then
  remaining = n + 1
  state = "open"
end
-- the fields acknowledgements read and write come first: a small hash is a flat
-- list that a field lookup scans from its head
rcall("HSET", metaKey,
  "state", state, "remaining", remaining, "done", "0", "total", n, "failed", "0",
  "retention", retentionMs, "concurrency", ARGV[3], "dedup", ARGV[8], "priority", ARGV[2],
  "client", ARGV[4], "created", nowMs, "queue", ARGV[1], "max_deliveries", ARGV[5],
  "mode", ARGV[9], "incarnation", incarnation)
if due > 0 then rcall("HSET", metaKey, "due", due) end
if tonumber(ARGV[12]) > 0 then rcall("HSET", metaKey, "timeout", ARGV[12]) end

-- the reply of a job created here, from what was just written (no read back)
local completed = 0
if remaining == 0 then
  state = complete_job(metaKey, tasksKey, resultsKey, errorsKey, dlqKey, nowMs)
  completed = 1
end
return {1, ARGV[1], completed, state, n, 0, 0, tonumber(ARGV[3]), ARGV[8], tonumber(ARGV[2]),
        ARGV[4], nowMs, tonumber(retentionMs), incarnation, 0, due}
