--[[
  Abort a job in its own hash slot: an open or active job becomes terminal with
  state `aborted` at once. No add passes afterwards (fenced adds need
  `open`), its undelivered and pending sub-requests are dropped (stream and
  group deleted, retries and start records too; a worker acknowledging one
  later finds nothing to acknowledge), and its keys expire after the job's
  retention (the dead letters not yet announced too: the reaper announces
  them meanwhile). The results stored so far stay readable until then.
  Aborting a job that is terminal already changes nothing. Idempotent by a
  token the caller chooses per call (stored in meta `closer`): a call that
  finds the job aborted under its own token was applied before and its reply
  lost; it replies completed 1 again, so that the caller still finishes the
  job (finish_jobs does that once).

  Input:
    KEYS[1] meta      sq:{<queue>/<job>}:meta            HASH
    KEYS[2] tasks     sq:{<queue>/<job>}:tasks           STREAM
    KEYS[3] results   sq:{<queue>/<job>}:results         HASH
    KEYS[4] errors    sq:{<queue>/<job>}:errors          HASH
    KEYS[5] retry     sq:{<queue>/<job>}:retry           ZSET
    KEYS[6] inflight  sq:{<queue>/<job>}:inflight        HASH
    KEYS[7] added     sq:{<queue>/<job>}:added           HASH deterministic id -> index
    KEYS[8] ids       sq:{<queue>/<job>}:ids             HASH index -> deterministic id
    KEYS[9] dlq       sq:{<queue>/<job>}:dlq             HASH dead-letter payloads
    KEYS[10] unannounced sq:{<queue>/<job>}:unannounced  SET dead letters not yet announced
    ARGV[1] reason (stored in meta `abort_reason`)
    ARGV[2] closer token, unique per abort call ("" for none)
    ARGV[3] write token ("" for none): when given, the job is aborted only if
            that write opened it (its incarnation) and it is still open (not
            committed); any other job is left unchanged (reply completed 0)

  Output:
    the job_reply fields {completed (0|1), state, total, done, failed, ...}
    `completed` is 1 when this call aborted the job: the caller must then
    finish it in the queue's hash slot (finish_jobs), which records its one completion.
    ERR_JOB_NOT_FOUND (-1) no such job
]]
local rcall = redis.call
local metaKey, tasksKey, resultsKey, errorsKey, retryKey, inflightKey, addedKey, idsKey, dlqKey,
      unannouncedKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8],
      KEYS[9], KEYS[10]
local reason = ARGV[1]

--- @include "includes/errors"
--- @include "includes/now_ms"
--- @include "includes/job_reply"

local m = rcall("HMGET", metaKey, "state", "closer", "incarnation")
local state = m[1]
if not state then return ERR_JOB_NOT_FOUND end
local ownerOnly = ARGV[3] ~= nil and ARGV[3] ~= ""
if ownerOnly and m[3] ~= ARGV[3] then return job_reply(metaKey, 0) end
if ownerOnly and state == "active" then return job_reply(metaKey, 0) end -- committed
if state ~= "open" and state ~= "active" then
  -- terminal: aborted by this call before (its reply lost), or ended otherwise
  if ARGV[2] ~= "" and m[2] == ARGV[2] then return job_reply(metaKey, 1) end
  return job_reply(metaKey, 0)
end

rcall("HSET", metaKey, "state", "aborted", "finished", now_ms(), "abort_reason", reason,
      "closer", ARGV[2])
rcall("DEL", tasksKey, retryKey, inflightKey)
local retentionMs = rcall("HGET", metaKey, "retention")
for _, key in ipairs({metaKey, resultsKey, errorsKey, addedKey, idsKey, dlqKey, unannouncedKey}) do
  rcall("PEXPIRE", key, retentionMs)
end
return job_reply(metaKey, 1)
