--[[
  Recover a lane's stalled small jobs (streamq.lane): entries pending longer
  than `min_idle` (their worker died or hangs; a live worker keeps its
  entries fresh). One XAUTOCLAIM call scans a bounded slice of the pending
  list; the caller loops on the returned cursor. Each stalled entry is
  re-added for another worker, marked suspect ("s" = 1, so the next worker
  records its start). An entry whose start was recorded (it was inside a
  handler when its worker died) counts one attempt; one read but never
  started counts none. An entry whose attempts reached its job's
  max_deliveries is dead-lettered and its job completes as failed.
  Finished jobs whose retention passed are forgotten (a bounded number per
  call), so a shard nobody acknowledges on still lets them go. Ids
  XAUTOCLAIM reports as deleted are acknowledged. An entry without a job,
  type or payload, or whose job has no record, is dead-lettered as malformed.

  Input:
    KEYS[1] lane     sq:{<shard>}:lane:<prio>:<client>  STREAM
    KEYS[2] ljobs    sq:{<shard>}:ljobs     HASH
    KEYS[3] lerrors  sq:{<shard>}:lerrors   HASH
    KEYS[4] lstarts  sq:{<shard>}:lstarts   HASH
    KEYS[5] lactive  sq:{<shard>}:lactive   ZSET
    KEYS[6] ldone    sq:{<shard>}:ldone     ZSET
    KEYS[7] events   sq:{<shard>}:events    STREAM
    KEYS[8] dead     sq:{<shard>}:dead      STREAM
    KEYS[9] lresults sq:{<shard>}:lresults  HASH job -> encoded result
    KEYS[10] lkept    sq:{<shard>}:lkept     STREAM id forget-after ms -> r, j (lane_complete)
    ARGV[1]  consumer group name
    ARGV[2]  cap on the events stream length (approximate)
    ARGV[3]  events retention, ms
    ARGV[4]  cap on the dead stream's length (approximate)
    ARGV[5]  consumer name the reaper claims as
    ARGV[6] min idle, ms
    ARGV[7] XAUTOCLAIM cursor ("0-0" to start)
    ARGV[8] XAUTOCLAIM COUNT
    ARGV[9] max deliveries override, 0 to use each job's own

  Output:
    {next cursor, re-added, dead-lettered, jobs completed (failed: those of the
    dead-lettered entries that had an active job)}; a lane whose stream is gone
    replies {"0-0", 0, 0, 0}
]]
local rcall = redis.call
local deadKey = KEYS[8]
local ctx = {lane = KEYS[1], ljobs = KEYS[2], lresults = KEYS[9], lerrors = KEYS[3],
             lstarts = KEYS[4], lactive = KEYS[5], ldone = KEYS[6], events = KEYS[7],
             lkept = KEYS[10],
             eventsMax = ARGV[2], eventsRetention = ARGV[3],
             queueChannel = sq_channel(SQ_TAG), jobChannel = sq_channel(SQ_TAG) .. ":",
             queue = sq_queue_of(SQ_TAG)}
local group, override = ARGV[1], tonumber(ARGV[9])

--- @include "includes/now_ms"
--- @include "includes/lane_complete"

local nowMs = now_ms()
ctx.done = lane_done()
lane_trim(ctx, nowMs, 1000)
if rcall("EXISTS", ctx.lane) == 0 then return {"0-0", 0, 0, 0} end
local claimed = rcall("XAUTOCLAIM", ctx.lane, group, ARGV[5], ARGV[6], ARGV[7],
                      "COUNT", tonumber(ARGV[8]))
local cursor, entries, deleted = claimed[1], claimed[2], claimed[3] or {}
local readded, dead, completed = 0, 0, 0

for _, id in ipairs(deleted) do
  rcall("XACK", ctx.lane, group, id)
  rcall("HDEL", ctx.lstarts, id)
end

for _, entry in ipairs(entries) do
  local id, list = entry[1], entry[2]
  local f = {}
  for k = 1, #list, 2 do f[list[k]] = list[k + 1] end
  local attempts = tonumber(f["a"] or "0") or 0
  if rcall("HDEL", ctx.lstarts, id) == 1 then attempts = attempts + 1 end
  rcall("XACK", ctx.lane, group, id)
  rcall("XDEL", ctx.lane, id)
  local job, raw = f["j"], nil
  if job then raw = rcall("HGET", ctx.ljobs, job) end
  if not (raw and f["t"] and f["p"]) then
    if not lane_active(raw) then raw = nil end
    lane_dead(ctx, deadKey, ARGV[4], job, raw, id,
              "malformed entry: missing job, type or payload, or a job without a record",
              attempts, f["t"], f["p"], nowMs)
    dead = dead + 1
    if raw then completed = completed + 1 end
  elseif not lane_active(raw) then
    -- settled before (its job completed): nothing to run
  else
    local maxDeliveries = lane_field(raw, "max_deliveries")
    if override > 0 and override < maxDeliveries then maxDeliveries = override end
    if attempts >= maxDeliveries then
      lane_dead(ctx, deadKey, ARGV[4], job, raw, id,
                "worker lost while running it (killed or crashed) " .. attempts .. " times",
                attempts, f["t"], f["p"], nowMs)
      dead = dead + 1
      completed = completed + 1
    else
      if f["c"] then  -- a trace context (streamq.tracing) goes with the entry
        rcall("XADD", ctx.lane, "*", "j", job, "t", f["t"], "p", f["p"], "a", attempts, "s", 1,
              "c", f["c"])
      else
        rcall("XADD", ctx.lane, "*", "j", job, "t", f["t"], "p", f["p"], "a", attempts, "s", 1)
      end
      readded = readded + 1
    end
  end
end
lane_flush(ctx)
return {cursor, readded, dead, completed}
