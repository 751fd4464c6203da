--[[
  Acknowledge processed sub-requests and store their results, atomically.
  XACK and deletion go together (an acknowledged entry is garbage; see
  includes/delete_settled for how entries are deleted). Only an
  entry that XACK actually acknowledged stores its result and lowers the
  counter, so a sub-request processed twice is counted once.

  Input:
    KEYS[1] tasks    sq:{<queue>/<job>}:tasks     STREAM
    KEYS[2] meta     sq:{<queue>/<job>}:meta      HASH
    KEYS[3] results  sq:{<queue>/<job>}:results   HASH
    KEYS[4] errors   sq:{<queue>/<job>}:errors    HASH
    KEYS[5] inflight sq:{<queue>/<job>}:inflight  HASH entry id -> consumer (recorded starts)
    KEYS[6] dlq      sq:{<queue>/<job>}:dlq       HASH dead-letter payloads (expire with the job)
    ARGV[1] consumer group name
    ARGV[2..] triples (entry id, sub-request index, encoded result)

  Output:
    {acked, completed (0|1), state, total, ...}: `acked` then the job_reply fields.
    The meta field "started" keeps the earliest delivery of the entries settled
    (includes/first_start): the job's first start.
    `acked` counts entries this call acknowledged; `completed` is 1 when this
    call made the job terminal: the caller must then finish it in the queue's hash slot.
    A cancelled job's entries still pending (they were running at the cancel)
    store their results, which expire with the job, and complete nothing.
    A job that is gone (expired or never created) replies {0, 0, "", 0, ...}.
]]
local rcall = redis.call
local tasksKey, metaKey, resultsKey, errorsKey, inflightKey, dlqKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local group = ARGV[1]

--- @include "includes/now_ms"
--- @include "includes/complete_job"
--- @include "includes/chunked"
--- @include "includes/delete_settled"
--- @include "includes/first_start"

-- XACK every id at once (in slices of 500). Only what XACK acknowledged may
-- count. When it acknowledged them all (the usual case) that is every id;
-- otherwise some were settled before this call, and a delivered entry is
-- still in the stream exactly while it is pending (every script that settles
-- an entry deletes it in the same call), so the ones this call acknowledged
-- are the ones still in the stream (each id once). Then store their results,
-- 500 per HSET, and, unless the job completed (complete_job deletes the whole
-- stream), delete those entries (delete_settled: XTRIM MINID below the
-- oldest pending entry, XDEL for the rest)
local ids, fields = {}, {}
for j = 2, #ARGV, 3 do
  ids[#ids + 1] = ARGV[j]
end
-- the batch was read at once: its first entry's delivery stands for it
local nowMs = now_ms()
local started = first_start(tasksKey, group, ids[1], nowMs)
local ackedNow = 0
for i = 1, #ids, 500 do
  ackedNow = ackedNow + rcall("XACK", tasksKey, group, unpack(ids, i, math.min(i + 499, #ids)))
end
if ackedNow == #ids then
  for j = 2, #ARGV, 3 do
    fields[#fields + 1] = ARGV[j + 1]
    fields[#fields + 1] = ARGV[j + 2]
  end
else
  local kept, seen = {}, {}
  for j = 2, #ARGV, 3 do
    local id = ARGV[j]
    if not seen[id] and #rcall("XRANGE", tasksKey, id, id) > 0 then
      kept[#kept + 1] = id
      fields[#fields + 1] = ARGV[j + 1]
      fields[#fields + 1] = ARGV[j + 2]
    end
    seen[id] = true
  end
  ids = kept
end
-- meta is read once (the reply and the counters) and written once: the counters,
-- and the terminal state when this call completes the job
local acked = #ids
local completed = 0
local m = rcall("HMGET", metaKey, "state", "remaining", "done", "total", "failed", "retention",
                "concurrency", "dedup", "priority", "client", "created", "incarnation",
                "dead", "started")
local state, done = m[1] or "", tonumber(m[3] or "0")
if acked > 0 then
  chunked("HSET", resultsKey, fields)
  if rcall("EXISTS", inflightKey) == 1 then chunked("HDEL", inflightKey, ids) end
  done = done + acked
  local remaining = tonumber(m[2] or "0") - acked
  local counters = {"remaining", remaining, "done", done}
  if started and (m[14] == false or started < tonumber(m[14])) then
    counters[#counters + 1] = "started"
    counters[#counters + 1] = started
  end
  if remaining <= 0 and state == "active" then
    state = complete_known(metaKey, tasksKey, resultsKey, errorsKey, dlqKey, nowMs, m[6],
                           tonumber(m[4] or "0"), tonumber(m[5] or "0"), counters)
    completed = 1
  else
    rcall("HSET", metaKey, unpack(counters))
    delete_settled(tasksKey, group, ids)
    if state == "cancelled" then
      -- a sub-request that was running when its job was cancelled: its result is
      -- kept as long as the job's records; the stream goes with its last entry
      rcall("PEXPIRE", resultsKey, rcall("PTTL", metaKey))
      if rcall("XLEN", tasksKey) == 0 then rcall("DEL", tasksKey) end
    end
  end
end
return {acked, completed, state, tonumber(m[4] or "0"), done, tonumber(m[5] or "0"),
        tonumber(m[7] or "1"), m[8] or "", tonumber(m[9] or "0"), m[10] or "",
        tonumber(m[11] or "0"), tonumber(m[6] or "0"), m[12] or "",
        tonumber(m[13] or "0")}
