--[[
  Store a job's new priority and/or concurrency in its meta (the second step
  of Queue.reprioritize, after `retoken` changed its tokens): what status
  shows, and the concurrency later steps (unpark, finish) read. Idempotent.

  Input:
    KEYS[1] meta  sq:{<queue>/<job>}:meta  HASH
    ARGV[1] new priority, "" to keep
    ARGV[2] new concurrency, "" to keep

  Output:
    {priority, concurrency} as stored now
    ERR_JOB_NOT_FOUND (-1)  no such job
    ERR_JOB_FINISHED (-4)   the job is terminal (nothing changed)
]]
local rcall = redis.call
local metaKey = KEYS[1]

--- @include "includes/errors"

local state = rcall("HGET", metaKey, "state")
if not state then return ERR_JOB_NOT_FOUND end
if state ~= "open" and state ~= "active" then return ERR_JOB_FINISHED end
if ARGV[1] ~= "" then rcall("HSET", metaKey, "priority", ARGV[1]) end
if ARGV[2] ~= "" then rcall("HSET", metaKey, "concurrency", ARGV[2]) end
local m = rcall("HMGET", metaKey, "priority", "concurrency")
return {tonumber(m[1]), tonumber(m[2])}
