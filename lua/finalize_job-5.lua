--[[
  Close an open (streaming) job: drop the counter's extra 1 that kept the
  job from completing while a producer was adding. Finalizing twice changes
  nothing the second time. Idempotent by a token the caller chooses per call
  (stored in meta `closer`): a call that finds the job closed by its own token
  was applied before and its reply lost; when the job is terminal it replies
  completed 1, so that the caller still finishes it (finish_jobs does that once).

  Input:
    KEYS[1] meta     sq:{<queue>/<job>}:meta     HASH
    KEYS[2] tasks    sq:{<queue>/<job>}:tasks    STREAM
    KEYS[3] results  sq:{<queue>/<job>}:results  HASH
    KEYS[4] errors   sq:{<queue>/<job>}:errors   HASH
    KEYS[5] dlq      sq:{<queue>/<job>}:dlq      HASH dead-letter payloads (expire with the job)
    ARGV[1] closer token, unique per finalize call ("" for none)
    ARGV[2] write token ("" for none): when given, only the write that opened
            the job (its incarnation) may finalize it
    ARGV[3] expected total ("" for none): when given, the job is finalized only
            if it holds exactly that many sub-requests (a write's commit: the
            sub-requests its successful tasks produced), else nothing changes

  Output:
    the job_reply fields {completed (0|1), state, total, done, failed, ...}
    `completed` is 1 when this call made the job terminal: the caller must
    then finish it in the queue's hash slot.
    ERR_JOB_NOT_FOUND (-1) no such job
    ERR_NOT_WRITER (-6)    ARGV[2] given and the job was opened by another write
    {ERR_TOTAL_MISMATCH (-3), the job's total}  ARGV[3] given and the job is open
                           with another total: nothing changed
]]
local rcall = redis.call
local metaKey, tasksKey, resultsKey, errorsKey, dlqKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

--- @include "includes/errors"
--- @include "includes/now_ms"
--- @include "includes/job_reply"
--- @include "includes/complete_job"

local m = rcall("HMGET", metaKey, "state", "closer", "incarnation", "total")
local state = m[1]
if not state then return ERR_JOB_NOT_FOUND end
if ARGV[2] ~= "" and m[3] ~= ARGV[2] then return ERR_NOT_WRITER end
if state ~= "open" then
  -- closed before: by this call (its reply lost) or by another
  if ARGV[1] ~= "" and m[2] == ARGV[1] and state ~= "active" then
    return job_reply(metaKey, 1)
  end
  return job_reply(metaKey, 0)
end

if ARGV[3] ~= "" and tonumber(m[4]) ~= tonumber(ARGV[3]) then
  return {ERR_TOTAL_MISMATCH, tonumber(m[4])}
end
rcall("HSET", metaKey, "state", "active", "closer", ARGV[1])
if rcall("HINCRBY", metaKey, "remaining", -1) <= 0 then
  complete_job(metaKey, tasksKey, resultsKey, errorsKey, dlqKey, now_ms())
  return job_reply(metaKey, 1)
end
return job_reply(metaKey, 0)
