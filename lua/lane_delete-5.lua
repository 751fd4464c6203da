--[[
  Delete a finished small job's records now, rather than when its retention
  ends (Queue.delete, streamq delete): its record in `ljobs`, its result, its
  error record and its place in `ldone`. A small job that has not finished is
  refused: cancel it first. Its completion record in `events` stays, as its
  dead letter in the shard's dead stream does (replayed, it goes to a new
  job). An entry of it a worker still holds (a cancelled job's, its handler
  running) is acknowledged and deleted here, as a job's own stream goes with
  its delete: the worker's acknowledgement or failure then finds it settled
  and changes nothing (no result, no retry, no dead letter), and no reaper
  reclaims it. Deleting again finds no job.

  Input:
    KEYS[1] lane      sq:{<shard>}:lane:<prio>:<client>  STREAM (+ consumer group ARGV[1])
    KEYS[2] ljobs     sq:{<shard>}:ljobs     HASH job -> JSON record
    KEYS[3] lresults  sq:{<shard>}:lresults  HASH job -> encoded result
    KEYS[4] lerrors   sq:{<shard>}:lerrors   HASH job -> JSON error record
    KEYS[5] ldone     sq:{<shard>}:ldone     ZSET job -> forget-after ms
    ARGV[1] consumer group name
    ARGV[2] lane member "<prio>|<client>": the lane the job's record names (KEYS[1];
            a cancelled job's must be, or the call is refused)
    ARGV[3] job id

  Output:
    1 deleted
    ERR_JOB_NOT_FOUND (-1) no such small job
    ERR_NOT_FINISHED (-10) the job has not finished
]]
local rcall = redis.call
local laneKey, ljobsKey, lresultsKey, lerrorsKey, ldoneKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5]
local group, member, job = ARGV[1], ARGV[2], ARGV[3]

--- @include "includes/errors"
--- @include "includes/lane_complete"
--- @include "includes/lane_find"

local raw = rcall("HGET", ljobsKey, job)
if not raw then return ERR_JOB_NOT_FOUND end
if lane_active(raw) then return ERR_NOT_FINISHED end
-- (only a job cancelled while its entry was held has one left: a finished job's
-- entry was settled by its finish)
if lane_cancelled(raw) then
  if lane_member_of(raw) ~= member then
    return redis.error_reply("ERR sq_lane_delete refused: ARGV[2] is not the lane the job's record names")
  end
  for _, e in ipairs(lane_entries_of(laneKey, job)) do
    rcall("XACK", laneKey, group, e[1])
    rcall("XDEL", laneKey, e[1])
  end
end
rcall("HDEL", ljobsKey, job)
rcall("HDEL", lresultsKey, job)
rcall("HDEL", lerrorsKey, job, job .. "|p")
rcall("ZREM", ldoneKey, job)
return 1
