--[[
  Re-run a failed or partial job's dead-lettered sub-requests in place
  (Queue.retry, streamq retry): each goes back into the job's stream as a
  new entry with no attempt made, leaves the job's dead letters, and is no
  longer counted failed; the job is `active` again under a new incarnation
  (the caller's retry token), so its next finish records one more
  completion, and its keys no longer expire. The caller then registers its
  tokens in its queue's hash slot (register_jobs; an intent written first
  lets the reaper do it for a caller that died in between). Only the
  sub-requests the caller names are re-run: those whose dead letters it
  claimed in the queue's hash slot (the markers `dlq replay` claims, so each
  runs once); a malformed entry's dead letter (no index) never is. Idempotent
  by the token: a
  call that finds the job under its own token was applied before and its
  reply lost; it changes nothing and replies as the first did.

  Input:
    KEYS[1] meta         sq:{<queue>/<job>}:meta         HASH
    KEYS[2] tasks        sq:{<queue>/<job>}:tasks        STREAM
    KEYS[3] results      sq:{<queue>/<job>}:results      HASH
    KEYS[4] errors       sq:{<queue>/<job>}:errors       HASH
    KEYS[5] dlq          sq:{<queue>/<job>}:dlq          HASH index -> type + payload
    KEYS[6] unannounced  sq:{<queue>/<job>}:unannounced  SET
    ARGV[1] consumer group name
    ARGV[2] retry token: the job's new incarnation
    ARGV[3..] the indexes of the dead-lettered sub-requests to re-run

  Output:
    {sub-requests put back, then the job_reply fields (completed 0)}
    ERR_JOB_NOT_FOUND (-1)     no such job
    ERR_NOT_FINISHED (-10)     the job has not finished (open or active)
    ERR_NOTHING_TO_RETRY (-11) the job did not fail (succeeded, cancelled, aborted),
                               or no dead letter of it is left to re-run
]]
local rcall = redis.call
local metaKey, tasksKey, resultsKey, errorsKey, dlqKey, unannouncedKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local group, token = ARGV[1], ARGV[2]

--- @include "includes/errors"
--- @include "includes/job_reply"

local function reply(moved)
  local r = job_reply(metaKey, 0)
  table.insert(r, 1, moved)
  return r
end

local m = rcall("HMGET", metaKey, "state", "incarnation", "retried")
if not m[1] then return ERR_JOB_NOT_FOUND end
if m[2] == token then return reply(tonumber(m[3] or "0")) end
if m[1] == "open" or m[1] == "active" then return ERR_NOT_FINISHED end
if m[1] ~= "failed" and m[1] ~= "partial" then return ERR_NOTHING_TO_RETRY end
local indexes = {}
for k = 3, #ARGV do
  if rcall("HEXISTS", dlqKey, ARGV[k]) == 1 then indexes[#indexes + 1] = ARGV[k] end
end
if #indexes == 0 then return ERR_NOTHING_TO_RETRY end

rcall("DEL", tasksKey)
rcall("XGROUP", "CREATE", tasksKey, group, "0", "MKSTREAM")
for _, index in ipairs(indexes) do
  local stored = rcall("HGET", dlqKey, index)
  rcall("XADD", tasksKey, "*", "i", index, "t", string.sub(stored, 1, 1),
        "p", string.sub(stored, 2))
  rcall("HDEL", errorsKey, index)
  rcall("HDEL", dlqKey, index)
  rcall("SREM", unannouncedKey, index)
end
local n = #indexes
rcall("HINCRBY", metaKey, "failed", -n)
rcall("HSET", metaKey, "state", "active", "remaining", n, "incarnation", token, "retried", n)
rcall("HDEL", metaKey, "finished", "due")
for _, key in ipairs({metaKey, resultsKey, errorsKey, dlqKey}) do
  rcall("PERSIST", key)
end
return reply(n)
