--[[
  Put a dead-lettered sub-request back into its (unfinished) job as a new
  entry with no attempts made: it leaves the dead letters, is no longer
  counted failed, and the job's counter of unfinished sub-requests rises.

  Input:
    KEYS[1] meta         sq:{<job>}:meta         HASH
    KEYS[2] tasks        sq:{<job>}:tasks        STREAM
    KEYS[3] errors       sq:{<job>}:errors       HASH
    KEYS[4] dlq          sq:{<job>}:dlq          HASH index -> type + payload
    KEYS[5] unannounced  sq:{<job>}:unannounced  SET
    ARGV[1] sub-request index

  Output:
    1 replayed
    ERR_JOB_NOT_FOUND (-1) the job is gone
    ERR_JOB_FINISHED (-4)  the job is terminal: replay into a new job instead
    ERR_NOT_DEAD (-5)      no dead letter with that index
]]
local rcall = redis.call
local metaKey, tasksKey, errorsKey, dlqKey, unannouncedKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local index = ARGV[1]

--- @include "includes/errors"

local state = rcall("HGET", metaKey, "state")
if not state then return ERR_JOB_NOT_FOUND end
if state ~= "open" and state ~= "active" then return ERR_JOB_FINISHED end
local stored = rcall("HGET", dlqKey, index)
if not stored or not tonumber(index) then return ERR_NOT_DEAD end

rcall("XADD", tasksKey, "*", "i", index, "t", string.sub(stored, 1, 1), "p", string.sub(stored, 2), "a", 0)
rcall("HDEL", errorsKey, index)
rcall("HDEL", dlqKey, index)
rcall("SREM", unannouncedKey, index)
rcall("HINCRBY", metaKey, "failed", -1)
rcall("HINCRBY", metaKey, "remaining", 1)
return 1
