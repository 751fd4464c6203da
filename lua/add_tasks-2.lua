--[[
  Append sub-requests to an open (streaming) job; each raises the job's
  counter of unfinished sub-requests by one.

  Input:
    KEYS[1] meta   sq:{<job>}:meta   HASH
    KEYS[2] tasks  sq:{<job>}:tasks  STREAM
    ARGV[1]   the total the caller expects the job to have now, "" for any: when
              it differs, nothing is added (a resumed or retried add is fenced)
    ARGV[2..] pairs (type, payload); indexes continue from the job's total

  Output:
    the job's new total (number of sub-requests added so far)
    ERR_JOB_NOT_FOUND (-1) no such job
    ERR_JOB_CLOSED (-2)    the job was finalized already
    ERR_TOTAL_MISMATCH (-3) the job's total is not ARGV[1]
]]
local rcall = redis.call
local metaKey, tasksKey = KEYS[1], KEYS[2]

--- @include "includes/errors"
--- @include "includes/add_entries"

local state = rcall("HGET", metaKey, "state")
if not state then return ERR_JOB_NOT_FOUND end
if state ~= "open" then return ERR_JOB_CLOSED end

local total = tonumber(rcall("HGET", metaKey, "total"))
if ARGV[1] ~= "" and tonumber(ARGV[1]) ~= total then return ERR_TOTAL_MISMATCH end
local n = add_entries(tasksKey, total, ARGV, 2)
rcall("HINCRBY", metaKey, "remaining", n)
return rcall("HINCRBY", metaKey, "total", n)
