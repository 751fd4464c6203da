--[[
  Acknowledge processed sub-requests and store their results, atomically.
  XACK and XDEL go together (an acknowledged entry is garbage). Only an
  entry that XACK actually acknowledged stores its result and lowers the
  counter, so a sub-request processed twice is counted once.

  Input:
    KEYS[1] tasks    sq:{<job>}:tasks    STREAM
    KEYS[2] meta     sq:{<job>}:meta     HASH
    KEYS[3] results  sq:{<job>}:results  HASH
    KEYS[4] errors   sq:{<job>}:errors   HASH
    KEYS[5] inflight sq:{<job>}:inflight HASH entry id -> consumer (recorded starts)
    ARGV[1] consumer group name
    ARGV[2] now, ms since the epoch
    ARGV[3..] triples (entry id, sub-request index, encoded result)

  Output:
    {acked, completed (0|1), state, total, ...}: `acked` then the job_reply fields
    `acked` counts entries this call acknowledged; `completed` is 1 when this
    call made the job terminal: the caller must then finish it in the queue slot.
    A job that is gone (expired or never created) replies {0, 0, "", 0, ...}.
]]
local rcall = redis.call
local tasksKey, metaKey, resultsKey, errorsKey, inflightKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, nowMs = ARGV[1], ARGV[2]

--- @include "includes/job_reply"
--- @include "includes/complete_job"

local acked = 0
for j = 3, #ARGV, 3 do
  local id = ARGV[j]
  if rcall("XACK", tasksKey, group, id) == 1 then
    rcall("XDEL", tasksKey, id)
    rcall("HDEL", inflightKey, id)
    rcall("HSET", resultsKey, ARGV[j + 1], ARGV[j + 2])
    acked = acked + 1
  end
end

local completed = 0
if acked > 0 then
  rcall("HINCRBY", metaKey, "done", acked)
  local remaining = rcall("HINCRBY", metaKey, "remaining", -acked)
  if remaining <= 0 and rcall("HGET", metaKey, "state") == "active" then
    complete_job(metaKey, tasksKey, resultsKey, errorsKey, nowMs)
    completed = 1
  end
end
local r = job_reply(metaKey, completed)
table.insert(r, 1, acked)
return r
