--[[
  Put a dead-lettered sub-request back into its (unfinished) job as a new
  entry with no attempts made: it leaves the dead letters, is no longer
  counted failed, and the job's counter of unfinished sub-requests rises.
  Only the dead letter with the given serial is replayed: once replayed
  (or replaced by a newer dead letter of the same sub-request) it is gone,
  so a resent call replays nothing twice.

  Input:
    KEYS[1] meta         sq:{<queue>/<job>}:meta         HASH
    KEYS[2] tasks        sq:{<queue>/<job>}:tasks        STREAM
    KEYS[3] errors       sq:{<queue>/<job>}:errors       HASH field -> JSON {error, attempts, at, n}
    KEYS[4] dlq          sq:{<queue>/<job>}:dlq          HASH index -> type + payload
    KEYS[5] unannounced  sq:{<queue>/<job>}:unannounced  SET
    ARGV[1] sub-request index
    ARGV[2] serial of the dead letter (meta `dead` when it was recorded; 0 for a
            record written before serials existed)
    ARGV[3] creation time (ms) of the job the dead letter belongs to, "" if unknown:
            a job id reused after its retention names another job, which is "gone"

  Output:
    1 replayed
    ERR_JOB_NOT_FOUND (-1) the job is gone (or its id names a newer job)
    ERR_NOT_DEAD (-5)      no such dead letter (replayed already)
    ERR_JOB_FINISHED (-4)  the job is terminal: replay into a new job instead
]]
local rcall = redis.call
local metaKey, tasksKey, errorsKey, dlqKey, unannouncedKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local index, serial = ARGV[1], ARGV[2]

--- @include "includes/errors"

local m = rcall("HMGET", metaKey, "state", "created")
local state = m[1]
if not state or (ARGV[3] ~= "" and m[2] ~= ARGV[3]) then return ERR_JOB_NOT_FOUND end
local rec = rcall("HGET", errorsKey, index)
local stored = rcall("HGET", dlqKey, index)
if not rec or not stored or not tonumber(index)
    or tostring(cjson.decode(rec).n or 0) ~= serial then
  return ERR_NOT_DEAD
end
if state ~= "open" and state ~= "active" then return ERR_JOB_FINISHED end

rcall("XADD", tasksKey, "*", "i", index, "t", string.sub(stored, 1, 1), "p", string.sub(stored, 2), "a", 0)
rcall("HDEL", errorsKey, index)
rcall("HDEL", dlqKey, index)
rcall("SREM", unannouncedKey, index)
rcall("HINCRBY", metaKey, "failed", -1)
rcall("HINCRBY", metaKey, "remaining", 1)
return 1
