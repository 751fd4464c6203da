--[[
  Move a job whose counter of unfinished sub-requests reached 0 to its
  terminal state, in the job's own slot.
  Terminal state: succeeded (nothing failed), failed (everything failed),
  partial (some failed). Sets `finished`, lets meta, results and errors expire
  after the job's retention (meta field `retention`, ms), the dead-letter payloads
  (`dlq`) with them, and deletes the (empty) task stream with its group.

  complete_known(..., retentionMs, total, failed, fields) is the same for a
  caller that has read those meta fields already; `fields` (field, value, ...)
  are written to meta in the same HSET. complete_job reads them itself.
  Both return the terminal state.
]]
local function complete_known(metaKey, tasksKey, resultsKey, errorsKey, dlqKey, nowMs,
                              retentionMs, total, failed, fields)
  local state = "succeeded"
  if failed > 0 then
    if failed >= total then state = "failed" else state = "partial" end
  end
  fields[#fields + 1] = "state"
  fields[#fields + 1] = state
  fields[#fields + 1] = "finished"
  fields[#fields + 1] = nowMs
  rcall("HSET", metaKey, unpack(fields))
  rcall("DEL", tasksKey)
  rcall("PEXPIRE", metaKey, retentionMs)
  rcall("PEXPIRE", resultsKey, retentionMs)
  -- errors and dlq hold the same fields (written and removed together): without
  -- errors there is no dlq either
  if rcall("PEXPIRE", errorsKey, retentionMs) == 1 then
    rcall("PEXPIRE", dlqKey, retentionMs)
  end
  return state
end

local function complete_job(metaKey, tasksKey, resultsKey, errorsKey, dlqKey, nowMs)
  local m = rcall("HMGET", metaKey, "retention", "total", "failed")
  return complete_known(metaKey, tasksKey, resultsKey, errorsKey, dlqKey, nowMs, m[1],
                        tonumber(m[2] or "0"), tonumber(m[3] or "0"), {})
end
