--[[
  Append sub-requests to an open (streaming) job; each raises the job's
  counter of unfinished sub-requests by one.

  Input:
    KEYS[1] meta   sq:{<job>}:meta   HASH
    KEYS[2] tasks  sq:{<job>}:tasks  STREAM
    ARGV[1..] pairs (type, payload); indexes continue from the job's total

  Output:
    the job's new total (number of sub-requests added so far)
    ERR_JOB_NOT_FOUND (-1) no such job
    ERR_JOB_CLOSED (-2)    the job was finalized already
]]
local rcall = redis.call
local metaKey, tasksKey = KEYS[1], KEYS[2]

--- @include "includes/errors"
--- @include "includes/add_entries"

local state = rcall("HGET", metaKey, "state")
if not state then return ERR_JOB_NOT_FOUND end
if state ~= "open" then return ERR_JOB_CLOSED end

local total = tonumber(rcall("HGET", metaKey, "total"))
local n = add_entries(tasksKey, total, ARGV, 1)
rcall("HINCRBY", metaKey, "remaining", n)
return rcall("HINCRBY", metaKey, "total", n)
