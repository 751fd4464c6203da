--[[
  Move a job whose counter of unfinished sub-requests reached 0 to its
  terminal state, in the job's own slot.
  Terminal state: succeeded (nothing failed), failed (everything failed),
  partial (some failed). Sets `finished`, lets meta, results and errors expire
  after the job's retention (meta field `retention`, ms), the dead-letter payloads
  (`dlq`) with them, and deletes the (empty) task stream with its group.
  Returns the terminal state.
]]
local function complete_job(metaKey, tasksKey, resultsKey, errorsKey, dlqKey, nowMs)
  local m = rcall("HMGET", metaKey, "retention", "total", "failed")
  local retentionMs = m[1]
  local total = tonumber(m[2] or "0")
  local failed = tonumber(m[3] or "0")
  local state = "succeeded"
  if failed > 0 then
    if failed >= total then state = "failed" else state = "partial" end
  end
  rcall("HSET", metaKey, "state", state, "finished", nowMs)
  rcall("DEL", tasksKey)
  rcall("PEXPIRE", metaKey, retentionMs)
  rcall("PEXPIRE", resultsKey, retentionMs)
  rcall("PEXPIRE", errorsKey, retentionMs)
  rcall("PEXPIRE", dlqKey, retentionMs)
  return state
end
