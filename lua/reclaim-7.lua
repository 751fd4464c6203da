--[[
  Recover a job's stalled entries: those pending longer than `min_idle`
  (their worker died or hangs; a live worker keeps its entries fresh). One
  XAUTOCLAIM call scans a bounded slice of the pending list; the caller
  loops on the returned cursor. Each stalled entry is re-added as a new
  entry for another worker, marked suspect ("s" = 1, so the next worker
  records its start). An entry whose start was recorded (it was inside a
  handler when its worker died) counts one attempt; one read but never
  started counts none. An entry that reached the job's max_deliveries is
  dead-lettered instead. Ids XAUTOCLAIM reports as deleted are acknowledged.
  An entry without index, type or payload is dead-lettered as malformed.
  A cancelled job's stalled entries are released (acknowledged and deleted),
  never re-added: nothing of a cancelled job starts again.

  Input:
    KEYS[1] tasks        sq:{<queue>/<job>}:tasks        STREAM
    KEYS[2] meta         sq:{<queue>/<job>}:meta         HASH
    KEYS[3] results      sq:{<queue>/<job>}:results      HASH
    KEYS[4] errors       sq:{<queue>/<job>}:errors       HASH
    KEYS[5] inflight     sq:{<queue>/<job>}:inflight     HASH entry id -> consumer
    KEYS[6] dlq          sq:{<queue>/<job>}:dlq          HASH
    KEYS[7] unannounced  sq:{<queue>/<job>}:unannounced  SET
    ARGV[1] consumer group name
    ARGV[2] consumer name the reaper claims as
    ARGV[3] min idle, ms
    ARGV[4] XAUTOCLAIM cursor ("0-0" to start)
    ARGV[5] XAUTOCLAIM COUNT (at most this many entries per call)
    ARGV[6] max deliveries override, 0 to use the job's own max_deliveries

  Output:
    {next cursor, re-added, dead-lettered, then the job_reply fields}
    A job that is gone, or whose stream is gone, replies {"0-0", 0, 0, ...}.
]]
local rcall = redis.call
local tasksKey, metaKey, resultsKey, errorsKey, inflightKey, dlqKey, unannouncedKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local group, consumer = ARGV[1], ARGV[2]

--- @include "includes/now_ms"
--- @include "includes/job_reply"
--- @include "includes/complete_job"
--- @include "includes/dead_letter"

local function reply(cursor, readded, dead, completed)
  local r = job_reply(metaKey, completed)
  table.insert(r, 1, dead)
  table.insert(r, 1, readded)
  table.insert(r, 1, cursor)
  return r
end

if rcall("EXISTS", metaKey) == 0 or rcall("EXISTS", tasksKey) == 0 then
  return reply("0-0", 0, 0, 0)
end
local nowMs = now_ms()

local claimed = rcall("XAUTOCLAIM", tasksKey, group, consumer, ARGV[3], ARGV[4],
                      "COUNT", tonumber(ARGV[5]))
local cursor, entries, deleted = claimed[1], claimed[2], claimed[3] or {}
local maxDeliveries = tonumber(rcall("HGET", metaKey, "max_deliveries") or "1")
if tonumber(ARGV[6]) > 0 and tonumber(ARGV[6]) < maxDeliveries then maxDeliveries = tonumber(ARGV[6]) end
local readded, dead, completed = 0, 0, 0

for _, id in ipairs(deleted) do
  rcall("XACK", tasksKey, group, id)
  rcall("HDEL", inflightKey, id)
end

local cancelled = rcall("HGET", metaKey, "state") == "cancelled"
for _, entry in ipairs(entries) do
  local id, list = entry[1], entry[2]
  local f = {}
  for k = 1, #list, 2 do f[list[k]] = list[k + 1] end
  local attempts = tonumber(f["a"] or "0") or 0
  if rcall("HDEL", inflightKey, id) == 1 then attempts = attempts + 1 end
  rcall("XACK", tasksKey, group, id)
  rcall("XDEL", tasksKey, id)
  if cancelled then
    -- its job was cancelled while a dead worker held it: released, never run again
  elseif not (f["i"] and tonumber(f["i"]) and f["t"] and f["p"]) then
    dead_letter(metaKey, errorsKey, dlqKey, unannouncedKey, nil, id,
                "malformed entry: missing or invalid index, type or payload", attempts,
                f["t"], f["p"], nowMs)
    dead = dead + 1
  elseif attempts >= maxDeliveries then
    if dead_letter(metaKey, errorsKey, dlqKey, unannouncedKey, f["i"], id,
                   "worker lost while running it (killed or crashed) " .. attempts .. " times",
                   attempts, f["t"], f["p"], nowMs) == 1 then
      completed = 1
    end
    dead = dead + 1
  else
    if f["c"] then  -- a trace context (streamq.tracing) goes with the entry
      rcall("XADD", tasksKey, "*", "i", f["i"], "t", f["t"], "p", f["p"], "a", attempts, "s", 1,
            "c", f["c"])
    else
      rcall("XADD", tasksKey, "*", "i", f["i"], "t", f["t"], "p", f["p"], "a", attempts, "s", 1)
    end
    readded = readded + 1
  end
end

if cancelled and rcall("XLEN", tasksKey) == 0 then rcall("DEL", tasksKey) end
if completed == 1 then
  complete_job(metaKey, tasksKey, resultsKey, errorsKey, dlqKey, nowMs)
end
return reply(cursor, readded, dead, completed)
