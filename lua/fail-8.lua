--[[
  A handler failed on a sub-request (or the entry is malformed): schedule its
  next attempt after a delay, or dead-letter it when its attempts reached the
  job's max_deliveries or the failure is final. Only an entry that XACK
  acknowledged is acted on, so a failure reported twice counts once.

  Input:
    KEYS[1] tasks        sq:{<queue>/<job>}:tasks        STREAM
    KEYS[2] meta         sq:{<queue>/<job>}:meta         HASH
    KEYS[3] results      sq:{<queue>/<job>}:results      HASH
    KEYS[4] errors       sq:{<queue>/<job>}:errors       HASH index -> JSON error record
    KEYS[5] retry        sq:{<queue>/<job>}:retry        ZSET member -> due ms
    KEYS[6] inflight     sq:{<queue>/<job>}:inflight     HASH entry id -> consumer
    KEYS[7] dlq          sq:{<queue>/<job>}:dlq          HASH index -> type + payload
    KEYS[8] unannounced  sq:{<queue>/<job>}:unannounced  SET of indexes
    ARGV[1] consumer group name
    ARGV[2] entry id
    ARGV[3] sub-request index ("-1" for a malformed entry)
    ARGV[4] attempts made, counting this one
    ARGV[5] retry delay, ms (a duration: the retry is due that long after Redis's
            clock now); -1 to dead-letter at once (a final failure)
    ARGV[6] error text
    ARGV[7] payload type letter
    ARGV[8] payload bytes
    ARGV[9] optional: the entry's trace context (field "c"), kept with its retry

  Output:
    {outcome, then the job_reply fields}: outcome 0 the entry was not pending
    (settled already), 1 retry scheduled, 2 dead-lettered. The meta field
    "started" keeps the earliest delivery of the entries settled (the job's
    first start, includes/first_start).
    ERR sq_fail: entry <id> holds another sub-request (or payload) than the call
    names: the call named the entry with an index, type or payload it does not
    hold; nothing is written
]]
local rcall = redis.call
local tasksKey, metaKey, resultsKey, errorsKey, retryKey, inflightKey, dlqKey, unannouncedKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local group, entryId, index, attempts, delay =
  ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])

--- @include "includes/now_ms"
--- @include "includes/job_reply"
--- @include "includes/complete_job"
--- @include "includes/dead_letter"
--- @include "includes/first_start"
--- @include "includes/entry_of"

local function reply(outcome, completed)
  local r = job_reply(metaKey, completed)
  table.insert(r, 1, outcome)
  return r
end

-- the entry holds the sub-request and payload the call names (a retry or a dead
-- letter is made of them; a malformed entry's index is -1, its missing or empty type "b"); one
-- settled before changes nothing
local entry = entry_of(tasksKey, entryId)
if not entry then return reply(0, 0) end
local held = field_of(entry, "i")  -- (1-9 digits, as the worker reads it; else -1)
held = (held and #held <= 9 and string.match(held, "^%d+$")) and tostring(tonumber(held)) or "-1"
if held ~= index then return entry_refused("fail", entryId, "another sub-request") end
local kind = field_of(entry, "t")
if kind == nil or kind == "" then kind = "b" end
if kind ~= ARGV[7] or (field_of(entry, "p") or "") ~= ARGV[8] then
  return entry_refused("fail", entryId, "another payload")
end
local nowMs = now_ms()
local started = first_start(tasksKey, group, entryId, nowMs)
if rcall("XACK", tasksKey, group, entryId) == 0 then
  return reply(0, 0)
end
local before = rcall("HGET", metaKey, "started")
if started and (not before or started < tonumber(before)) then
  rcall("HSET", metaKey, "started", started)
end
rcall("XDEL", tasksKey, entryId)
rcall("HDEL", inflightKey, entryId)
if rcall("HGET", metaKey, "state") == "cancelled" then
  -- it was running when its job was cancelled: no retry, no dead letter
  if rcall("XLEN", tasksKey) == 0 then rcall("DEL", tasksKey) end
  return reply(0, 0)
end

local maxDeliveries = tonumber(rcall("HGET", metaKey, "max_deliveries") or "1")
if delay >= 0 and attempts < maxDeliveries and index ~= "-1" then
  local kind = ARGV[7]
  if ARGV[9] and ARGV[9] ~= "" then kind = kind .. "," .. ARGV[9] end
  rcall("ZADD", retryKey, nowMs + delay, attempts .. "|" .. index .. "|" .. kind .. "|" .. ARGV[8])
  return reply(1, 0)
end

if dead_letter(metaKey, errorsKey, dlqKey, unannouncedKey, index, entryId, ARGV[6], attempts,
               ARGV[7], ARGV[8], nowMs) == 1 then
  complete_job(metaKey, tasksKey, resultsKey, errorsKey, dlqKey, nowMs)
  return reply(2, 1)
end
return reply(2, 0)
