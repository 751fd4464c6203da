--[[
  Delete a finished job's records now, rather than when its retention ends
  (Queue.delete, streamq delete): its meta, stream, results, errors, retries,
  start records, dead-letter payloads and add records. A job that has not
  finished (open or active) is refused: cancel it first. Its completion
  record in the queue's `events` stays, as its dead letters in the queue's
  dead stream do (replayed, one goes to a new job), and its entry in the
  queue's `finished` registry stays as the guard against a second finish
  until its time: listings skip a job whose meta is gone. An entry a worker
  still runs (a cancelled job's) is acknowledged into nothing. Deleting again
  finds no job.

  Input:
    KEYS[1]  meta         sq:{<queue>/<job>}:meta         HASH
    KEYS[2]  tasks        sq:{<queue>/<job>}:tasks        STREAM
    KEYS[3]  results      sq:{<queue>/<job>}:results      HASH
    KEYS[4]  errors       sq:{<queue>/<job>}:errors       HASH
    KEYS[5]  retry        sq:{<queue>/<job>}:retry        ZSET
    KEYS[6]  inflight     sq:{<queue>/<job>}:inflight     HASH
    KEYS[7]  dlq          sq:{<queue>/<job>}:dlq          HASH
    KEYS[8]  unannounced  sq:{<queue>/<job>}:unannounced  SET
    KEYS[9]  batches      sq:{<queue>/<job>}:batches      HASH
    KEYS[10] added        sq:{<queue>/<job>}:added        HASH
    KEYS[11] ids          sq:{<queue>/<job>}:ids          HASH

  Output:
    1 deleted
    ERR_JOB_NOT_FOUND (-1) no such job
    ERR_NOT_FINISHED (-10) the job has not finished (open or active)
]]
local rcall = redis.call
local metaKey = KEYS[1]

--- @include "includes/errors"

local state = rcall("HGET", metaKey, "state")
if not state then return ERR_JOB_NOT_FOUND end
if state == "open" or state == "active" then return ERR_NOT_FINISHED end
rcall("DEL", unpack(KEYS))  -- its 11 keys
return 1
