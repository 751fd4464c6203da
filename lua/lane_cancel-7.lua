--[[
  Cancel a small job (streamq.lane) in its shard's slot. An active job's
  record turns `cancelled` and its completion is recorded and published once
  (lane_complete). Its entry, when no worker has read it yet, is deleted, and
  a retry of it waiting in the lane's retry set is removed: it never starts.
  When a worker holds it (pending), it may be running: its acknowledgement
  still stores its result, its failure ends it (no retry, no dead letter),
  and neither a hand-back nor the reaper puts it back. Cancelling a job that
  is terminal already changes nothing, so a call sent again is a no-op; a call
  resent after its reply was lost carries the same closer token, which the
  cancelled record keeps, and replies as the call that cancelled the job did
  (cancelled 1, and the entry still held), as the job lane's cancel_job does.

  The lane stream is scanned for the job's entry: it holds the lane's
  unfinished entries only (settled entries are deleted).

  Input:
    KEYS[1] lane     sq:{<shard>}:lane:<prio>:<client>        STREAM
    KEYS[2] retry    sq:{<shard>}:lane:<prio>:<client>:retry  ZSET
            "<attempts>|<job>|<type><payload>" -> due ms
    KEYS[3] ljobs    sq:{<shard>}:ljobs    HASH job -> JSON record
    KEYS[4] lactive  sq:{<shard>}:lactive  ZSET job -> submit ms
    KEYS[5] ldone    sq:{<shard>}:ldone    ZSET job -> forget-after ms
    KEYS[6] events   sq:{<shard>}:events   STREAM of completion records
    KEYS[7] lkept    sq:{<shard>}:lkept     STREAM id forget-after ms -> r, j (lane_complete)
    ARGV[1] consumer group name
    ARGV[2] cap on the events stream length (approximate)
    ARGV[3] events retention, ms
    ARGV[4] job id
    ARGV[5] closer token, unique per cancel call ("" for none)

  Output:
    {cancelled (0|1), held}: cancelled 1 when this call cancelled the job; held is
    the id of its entry a worker holds ("" for none)
    {2, ""}: the job is active and its record names another lane than KEYS[1] (it
    moved: lane_reprioritize); nothing changed, the caller reads the record again
    ERR_JOB_NOT_FOUND (-1) no record of the job
]]
local rcall = redis.call
local retryKey = KEYS[2]
local ctx = {lane = KEYS[1], ljobs = KEYS[3], lresults = "", lerrors = "",
             lstarts = "", lactive = KEYS[4], ldone = KEYS[5], events = KEYS[6],
             lkept = KEYS[7],
             eventsMax = ARGV[2], eventsRetention = ARGV[3],
             queueChannel = sq_channel(SQ_TAG), jobChannel = sq_channel(SQ_TAG) .. ":",
             queue = sq_queue_of(SQ_TAG)}
local group, job, closer = ARGV[1], ARGV[4], ARGV[5]

--- @include "includes/errors"
--- @include "includes/now_ms"
--- @include "includes/lane_complete"
--- @include "includes/lane_find"

local raw = rcall("HGET", ctx.ljobs, job)
if not raw then return ERR_JOB_NOT_FOUND end
-- an active record names the lane its entry or retry is in (lane_reprioritize moves
-- both and rewrites it in one call): a call naming another lane, made from the record
-- as it was before a move, would find neither; it changes nothing
if lane_active(raw) then
  local prio, client = string.match(ctx.lane, "^sq:{[^}]*}:lane:(%d+):(.*)$")
  if tostring(prio) .. "|" .. tostring(client) ~= lane_member_of(raw) then return {2, ""} end
end

-- the job's entry: held by a worker (pending), or read by none (deleted: it never starts)
local held = ""
for _, e in ipairs(lane_entries_of(ctx.lane, job)) do
  if #rcall("XPENDING", ctx.lane, group, e[1], e[1], 1) > 0 then
    held = e[1]
  elseif lane_active(raw) then
    rcall("XDEL", ctx.lane, e[1])
  end
end
if not lane_active(raw) then
  -- cancelled by this call before its reply was lost: the same reply again
  if closer ~= "" and lane_cancelled(raw) and
     string.find(raw, '"closer":"' .. closer .. '"', 1, true) then
    return {1, held}
  end
  return {0, held}
end

for _, member in ipairs(lane_retries_of(retryKey, job)) do
  rcall("ZREM", retryKey, member)
end
ctx.done = lane_done()
lane_complete(ctx, job, raw, "cancelled", 0, 0, now_ms())
if closer ~= "" then
  -- the closer goes last: the record's first fields (state, done, failed) keep
  -- their order, which lane_ack rewrites in place
  local rec = ctx.done.records[#ctx.done.records]
  ctx.done.records[#ctx.done.records] =
    string.sub(rec, 1, #rec - 1) .. ',"closer":"' .. closer .. '"}'
end
lane_flush(ctx)
return {1, held}
