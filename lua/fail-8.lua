--[[
  A handler failed on a sub-request (or the entry is malformed): schedule its
  next attempt after a delay, or dead-letter it when its attempts reached the
  job's max_deliveries or the failure is final. Only an entry that XACK
  acknowledged is acted on, so a failure reported twice counts once.

  Input:
    KEYS[1] tasks        sq:{<job>}:tasks        STREAM
    KEYS[2] meta         sq:{<job>}:meta         HASH
    KEYS[3] results      sq:{<job>}:results      HASH
    KEYS[4] errors       sq:{<job>}:errors       HASH index -> JSON error record
    KEYS[5] retry        sq:{<job>}:retry        ZSET member -> due ms
    KEYS[6] inflight     sq:{<job>}:inflight     HASH entry id -> consumer
    KEYS[7] dlq          sq:{<job>}:dlq          HASH index -> type + payload
    KEYS[8] unannounced  sq:{<job>}:unannounced  SET of indexes
    ARGV[1] consumer group name
    ARGV[2] now, ms since the epoch
    ARGV[3] entry id
    ARGV[4] sub-request index ("-1" for a malformed entry)
    ARGV[5] attempts made, counting this one
    ARGV[6] retry delay, ms; -1 to dead-letter at once (a final failure)
    ARGV[7] error text
    ARGV[8] payload type letter
    ARGV[9] payload bytes

  Output:
    {outcome, then the job_reply fields}: outcome 0 the entry was not pending
    (settled already), 1 retry scheduled, 2 dead-lettered
]]
local rcall = redis.call
local tasksKey, metaKey, resultsKey, errorsKey, retryKey, inflightKey, dlqKey, unannouncedKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local group, nowMs, entryId, index, attempts, delay =
  ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])

--- @include "includes/job_reply"
--- @include "includes/complete_job"
--- @include "includes/dead_letter"

local function reply(outcome, completed)
  local r = job_reply(metaKey, completed)
  table.insert(r, 1, outcome)
  return r
end

if rcall("XACK", tasksKey, group, entryId) == 0 then
  return reply(0, 0)
end
rcall("XDEL", tasksKey, entryId)
rcall("HDEL", inflightKey, entryId)

local maxDeliveries = tonumber(rcall("HGET", metaKey, "max_deliveries") or "1")
if delay >= 0 and attempts < maxDeliveries and index ~= "-1" then
  rcall("ZADD", retryKey, nowMs + delay,
        attempts .. "|" .. index .. "|" .. ARGV[8] .. "|" .. ARGV[9])
  return reply(1, 0)
end

if dead_letter(metaKey, errorsKey, dlqKey, unannouncedKey, index, entryId, ARGV[7], attempts,
               ARGV[8], ARGV[9], nowMs) == 1 then
  complete_job(metaKey, tasksKey, resultsKey, errorsKey, dlqKey, nowMs)
  return reply(2, 1)
end
return reply(2, 0)
