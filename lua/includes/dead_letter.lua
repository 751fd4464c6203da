--[[
  Dead-letter one sub-request in its job's hash slot: keep its error record
  (JSON: error, attempts, at, n) and its payload, count it failed and settle
  it (the counter of unfinished sub-requests drops by one), and remember it
  as not yet announced in the queue's dead-letter stream.
  `n` is the dead letter's serial in its job (meta `dead`, counting every dead
  letter the job ever recorded): a sub-request replayed and dead-lettered
  again is a new dead letter with a new serial, announced and replayable once
  more. `unannounced` lives at most the job's retention + 7 days from its
  last dead letter (config.UNANNOUNCED_GRACE_MS), so a set nobody announces
  (no reaper ran) still goes.
  An entry without a valid index (malformed) is recorded under
  "entry:<id>" and changes no counter, since it was never counted.
  Returns 1 when the counter reached 0 on an active job (the job must complete).
]]
local function dead_letter(metaKey, errorsKey, dlqKey, unannouncedKey, index, entryId,
                           errText, attempts, kind, payload, nowMs)
  local field = index
  if index == nil or index == "" or index == "-1" then field = "entry:" .. entryId end
  local serial = rcall("HINCRBY", metaKey, "dead", 1)
  rcall("HSET", errorsKey, field,
        cjson.encode({error = errText, attempts = tonumber(attempts), at = tonumber(nowMs),
                      n = serial}))
  rcall("HSET", dlqKey, field, (kind or "b") .. (payload or ""))
  rcall("SADD", unannouncedKey, field)
  rcall("PEXPIRE", unannouncedKey,
        tonumber(rcall("HGET", metaKey, "retention") or "0") + 604800000)
  if field ~= index then return 0 end
  rcall("HINCRBY", metaKey, "failed", 1)
  local remaining = rcall("HINCRBY", metaKey, "remaining", -1)
  if remaining <= 0 and rcall("HGET", metaKey, "state") == "active" then return 1 end
  return 0
end
