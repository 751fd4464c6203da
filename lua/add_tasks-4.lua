--[[
  Append sub-requests to an open (streaming) job; each raises the job's
  counter of unfinished sub-requests by one. Idempotent by a batch id the
  caller chooses per call: a call whose batch id was applied before (its
  reply lost, the call sent again) adds nothing and replies what the first
  call replied, even when the job was finalized since.

  Input:
    KEYS[1] meta     sq:{<queue>/<job>}:meta     HASH
    KEYS[2] tasks    sq:{<queue>/<job>}:tasks    STREAM
    KEYS[3] batches  sq:{<queue>/<job>}:batches  HASH batch id -> index of its first sub-request;
                     expires the job's retention (meta `retention`) after the latest add,
                     so never later than the job's own keys
    KEYS[4] retry    sq:{<queue>/<job>}:retry  ZSET a scheduled job's sub-requests (meta `due`)
    ARGV[1]   the total the caller expects the job to have now, "" for any: when
              it differs, nothing is added (a second producer of one submit is fenced)
    ARGV[2]   batch id, unique per call (chosen by the caller)
    ARGV[3..] pairs (type, payload); indexes continue from the job's total; an odd
              count ends in a trace context the entries carry (includes/add_entries)

  Output:
    the index after this call's last sub-request (the job's total right after it
    was applied), the same for the call and its resends
    ERR_JOB_NOT_FOUND (-1)  no such job
    ERR_JOB_CLOSED (-2)     the job was finalized already
    ERR_TOTAL_MISMATCH (-3) the job's total is not ARGV[1]
]]
local rcall = redis.call
local metaKey, tasksKey, batchesKey, retryKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local batch = ARGV[2]

--- @include "includes/errors"
--- @include "includes/now_ms"
--- @include "includes/add_entries"

local first = rcall("HGET", batchesKey, batch)
if first then return tonumber(first) + math.floor((#ARGV - 2) / 2) end

local m = rcall("HMGET", metaKey, "state", "total", "retention", "due")
if not m[1] then return ERR_JOB_NOT_FOUND end
if m[1] ~= "open" then return ERR_JOB_CLOSED end

local total = tonumber(m[2])
if ARGV[1] ~= "" and tonumber(ARGV[1]) ~= total then return ERR_TOTAL_MISMATCH end
-- a scheduled job's sub-requests wait in its retry ZSET until its time; once that
-- has come (promoted already, or about to be) they go to the stream as usual
local due = tonumber(m[4] or "0")
if due <= now_ms() then due = 0 end
local n = add_entries(tasksKey, total, ARGV, 3, retryKey, due)
rcall("HINCRBY", metaKey, "remaining", n)
rcall("HSET", batchesKey, batch, total)
rcall("PEXPIRE", batchesKey, m[3])
return rcall("HINCRBY", metaKey, "total", n)
