--[[
  Delete a finished small job's records now, rather than when its retention
  ends (Queue.delete, streamq delete): its record in `ljobs`, its result, its
  error record and its place in `ldone`. A small job that has not finished is
  refused: cancel it first. Its completion record in `events` stays, as its
  dead letter in the shard's dead stream does (replayed, it goes to a new
  job). An entry a worker still runs (a cancelled job's) is acknowledged into
  nothing. Deleting again finds no job.

  Input:
    KEYS[1] ljobs     sq:{<shard>}:ljobs     HASH job -> JSON record
    KEYS[2] lresults  sq:{<shard>}:lresults  HASH job -> encoded result
    KEYS[3] lerrors   sq:{<shard>}:lerrors   HASH job -> JSON error record
    KEYS[4] ldone     sq:{<shard>}:ldone     ZSET job -> forget-after ms
    ARGV[1] job id

  Output:
    1 deleted
    ERR_JOB_NOT_FOUND (-1) no such small job
    ERR_NOT_FINISHED (-10) the job has not finished
]]
local rcall = redis.call
local ljobsKey, lresultsKey, lerrorsKey, ldoneKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local job = ARGV[1]

--- @include "includes/errors"
--- @include "includes/lane_complete"

local raw = rcall("HGET", ljobsKey, job)
if not raw then return ERR_JOB_NOT_FOUND end
if lane_active(raw) then return ERR_NOT_FINISHED end
rcall("HDEL", ljobsKey, job)
rcall("HDEL", lresultsKey, job)
rcall("HDEL", lerrorsKey, job)
rcall("ZREM", ldoneKey, job)
return 1
