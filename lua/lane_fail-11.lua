--[[
  A handler failed on a small job's entry (streamq.lane), or the entry is
  malformed: schedule its next attempt after a delay, or dead-letter it when
  its attempts reached the job's max_deliveries or the failure is final (the
  job then completes as failed). Only an entry XACK acknowledged is acted on,
  so a failure reported twice counts once. The failure of an entry whose job
  was cancelled while it ran ends it: no retry, no dead letter (reply 0).

  Input:
    KEYS[1]  lane     sq:{<shard>}:lane:<prio>:<client>        STREAM
    KEYS[2]  retry    sq:{<shard>}:lane:<prio>:<client>:retry  ZSET
             "<attempts>|<job>|<type><payload>" -> due ms
    KEYS[3]  ljobs    sq:{<shard>}:ljobs     HASH
    KEYS[4]  lerrors  sq:{<shard>}:lerrors   HASH
    KEYS[5]  lstarts  sq:{<shard>}:lstarts   HASH
    KEYS[6]  lactive  sq:{<shard>}:lactive   ZSET
    KEYS[7]  ldone    sq:{<shard>}:ldone     ZSET
    KEYS[8]  events   sq:{<shard>}:events    STREAM
    KEYS[9]  dead     sq:{<shard>}:dead      STREAM of dead letters
    KEYS[10] retries  sq:{<shard>}:retries   ZSET "lane|<prio>|<client>" -> due ms of
             the lane's earliest retry (live workers promote it then)
    KEYS[11] lkept    sq:{<shard>}:lkept     STREAM id forget-after ms -> r, j (lane_complete)
    ARGV[1]  consumer group name
    ARGV[2]  cap on the events stream length (approximate)
    ARGV[3]  events retention, ms
    ARGV[4]  cap on the dead stream's length (approximate)
    ARGV[5]  lane member "<prio>|<client>"
    ARGV[6] entry id
    ARGV[7] job id ("" for an entry without one)
    ARGV[8] attempts made, counting this one
    ARGV[9] retry delay, ms after Redis's clock now; -1 to dead-letter at once
    ARGV[10] error text
    ARGV[11] payload type letter
    ARGV[12] payload bytes
    ARGV[13] optional: the entry's trace context (field "c"), kept with its retry as
             "<attempts>|<job>,<context>|<type><payload>"

  Output:
    0 the entry was settled already, 1 retry scheduled, 2 dead-lettered
    ERR sq_lane_fail: entry <id> holds another job (or payload) than the call
    names: the call named the entry with a job, type or payload it does not hold;
    nothing is written
]]
local rcall = redis.call
local retryKey, deadKey, retriesKey = KEYS[2], KEYS[9], KEYS[10]
local ctx = {lane = KEYS[1], ljobs = KEYS[3], lresults = "", lerrors = KEYS[4],
             lstarts = KEYS[5], lactive = KEYS[6], ldone = KEYS[7], events = KEYS[8],
             lkept = KEYS[11],
             eventsMax = ARGV[2], eventsRetention = ARGV[3],
             queueChannel = sq_channel(SQ_TAG), jobChannel = sq_channel(SQ_TAG) .. ":",
             queue = sq_queue_of(SQ_TAG)}
local group, entryId, job = ARGV[1], ARGV[6], ARGV[7]
local attempts, delay = tonumber(ARGV[8]), tonumber(ARGV[9])

--- @include "includes/now_ms"
--- @include "includes/lane_complete"
--- @include "includes/entry_of"

-- the entry holds the job and payload the call names (a retry or a dead letter is
-- made of them; a malformed entry's missing or empty type is "b"); one settled before changes
-- nothing
local entry = entry_of(ctx.lane, entryId)
if not entry then return 0 end
if (field_of(entry, "j") or "") ~= job then
  return entry_refused("lane_fail", entryId, "another job")
end
local kind = field_of(entry, "t")
if kind == nil or kind == "" then kind = "b" end
if kind ~= ARGV[11] or (field_of(entry, "p") or "") ~= ARGV[12] then
  return entry_refused("lane_fail", entryId, "another payload")
end
if rcall("XACK", ctx.lane, group, entryId) == 0 then return 0 end
rcall("XDEL", ctx.lane, entryId)
rcall("HDEL", ctx.lstarts, entryId)
local nowMs = now_ms()
ctx.done = lane_done()
local raw = nil
if job ~= "" then
  raw = rcall("HGET", ctx.ljobs, job)
  -- it was running when its job was cancelled: no retry, no dead letter
  if lane_cancelled(raw) then return 0 end
  if not lane_active(raw) then raw = nil end
end
if raw and delay >= 0 and attempts < lane_field(raw, "max_deliveries") then
  local due = nowMs + delay
  local who = job
  if ARGV[13] and ARGV[13] ~= "" then who = job .. "," .. ARGV[13] end
  rcall("ZADD", retryKey, due, attempts .. "|" .. who .. "|" .. ARGV[11] .. ARGV[12])
  rcall("ZADD", retriesKey, "LT", due, "lane|" .. ARGV[5])
  return 1
end
lane_dead(ctx, deadKey, ARGV[4], job, raw, entryId, ARGV[10], attempts, ARGV[11], ARGV[12],
          nowMs)
lane_flush(ctx)
return 2
