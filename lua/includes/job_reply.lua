--[[
  The reply describing a job after a change in its slot:
  {completed (0|1), state, total, done, failed, concurrency, dedup, priority,
   client, created (ms), retention (ms), incarnation, dead letters recorded
   (meta `dead`), due (ms: when a scheduled job's sub-requests become ready; 0 for
   a job ready at once)}.
  `incarnation` tells this job from an earlier one of the same id (see create_job).
]]
local function job_reply(metaKey, completed)
  local m = rcall("HMGET", metaKey, "state", "total", "done", "failed", "concurrency", "dedup",
                  "priority", "client", "created", "retention", "incarnation",
                  "dead", "due")
  return {completed, m[1] or "", tonumber(m[2] or "0"), tonumber(m[3] or "0"),
          tonumber(m[4] or "0"), tonumber(m[5] or "1"), m[6] or "", tonumber(m[7] or "0"),
          m[8] or "", tonumber(m[9] or "0"), tonumber(m[10] or "0"), m[11] or "",
          tonumber(m[12] or "0"), tonumber(m[13] or "0")}
end
