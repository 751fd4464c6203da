--[[
  Close an open (streaming) job: drop the counter's extra 1 that kept the
  job from completing while a producer was adding. Finalizing twice changes
  nothing the second time.

  Input:
    KEYS[1] meta     sq:{<job>}:meta     HASH
    KEYS[2] tasks    sq:{<job>}:tasks    STREAM
    KEYS[3] results  sq:{<job>}:results  HASH
    KEYS[4] errors   sq:{<job>}:errors   HASH
    KEYS[5] dlq      sq:{<job>}:dlq      HASH dead-letter payloads (expire with the job)
    (no ARGV)

  Output:
    the job_reply fields {completed (0|1), state, total, done, failed, ...}
    `completed` is 1 when this call made the job terminal: the caller must
    then finish it in the queue slot.
    ERR_JOB_NOT_FOUND (-1) no such job
]]
local rcall = redis.call
local metaKey, tasksKey, resultsKey, errorsKey, dlqKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

--- @include "includes/errors"
--- @include "includes/now_ms"
--- @include "includes/job_reply"
--- @include "includes/complete_job"

local state = rcall("HGET", metaKey, "state")
if not state then return ERR_JOB_NOT_FOUND end
if state ~= "open" then return job_reply(metaKey, 0) end

rcall("HSET", metaKey, "state", "active")
if rcall("HINCRBY", metaKey, "remaining", -1) <= 0 then
  complete_job(metaKey, tasksKey, resultsKey, errorsKey, dlqKey, now_ms())
  return job_reply(metaKey, 1)
end
return job_reply(metaKey, 0)
