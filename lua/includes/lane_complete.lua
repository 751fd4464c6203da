--[[
  Complete a small job (streamq.lane) in its shard's slot: its record turns
  terminal, it leaves the registry of unfinished jobs, is kept for its
  retention in `ldone`, and its completion is recorded in the events stream
  and published on the job's and the queue's channels, all in the caller's
  script. `rec` is the decoded job record; `ctx` holds the keys and settings
  every lane script passes: ljobs, lactive, ldone, events, eventsMax,
  eventsRetention, queueChannel, jobChannel, publish, queue.
  The caller has made sure this happens once (only the call whose XACK
  acknowledged the job's entry completes it).
]]
local function lane_complete(ctx, job, rec, state, done, failed, nowMs)
  rec["state"] = state
  rec["done"] = done
  rec["failed"] = failed
  rec["finished"] = nowMs
  rcall("HSET", ctx.ljobs, job, cjson.encode(rec))
  rcall("ZREM", ctx.lactive, job)
  rcall("ZADD", ctx.ldone, nowMs + tonumber(rec["retention"] or 0), job)
  rcall("XADD", ctx.events, "*", "job", job, "state", state, "total", 1, "done", done,
        "failed", failed, "finished", nowMs)
  local message = '{"job_id":"' .. job .. '","queue":"' .. ctx.queue .. '","state":"' ..
    state .. '","total":1,"done":' .. done .. ',"failed":' .. failed .. ',"finished_ms":' ..
    nowMs .. '}'
  rcall(ctx.publish, ctx.jobChannel .. job, message)
  rcall(ctx.publish, ctx.queueChannel, message)
end

--[[
  Dead-letter a small job's entry: its error record in `lerrors`, one entry in
  the queue's dead-letter stream (it is in this slot: no second step), and the
  job completes as failed. `rec` is nil for an entry whose job has no record
  (malformed, or its record expired): only the dead letter is written.
]]
local function lane_dead(ctx, dead, deadMax, job, rec, entryId, errText, attempts, kind,
                         payload, nowMs)
  local created = 0
  if rec then created = tonumber(rec["created"] or 0) end
  if rec then
    rcall("HSET", ctx.lerrors, job,
          cjson.encode({error = errText, attempts = tonumber(attempts), at = nowMs, n = 1}))
  end
  local field = "0"
  if not rec then field = "entry:" .. entryId end
  rcall("XADD", dead, "MAXLEN", "~", deadMax, "*", "job", job or "", "index", field,
        "error", errText, "attempts", attempts, "at", nowMs, "t", kind or "b",
        "p", payload or "", "n", 1, "c", created)
  if rec and rec["state"] == "active" then
    lane_complete(ctx, job, rec, "failed", 0, 1, nowMs)
  end
end

--[[
  Forget small jobs whose retention passed (at most `limit` per call), and trim
  the events stream by the queue's retention and its cap.
]]
local function lane_trim(ctx, nowMs, limit)
  local old = rcall("ZRANGEBYSCORE", ctx.ldone, "-inf", nowMs, "LIMIT", 0, limit)
  if #old > 0 then
    rcall("HDEL", ctx.ljobs, unpack(old))
    rcall("HDEL", ctx.lresults, unpack(old))
    rcall("HDEL", ctx.lerrors, unpack(old))
    rcall("ZREM", ctx.ldone, unpack(old))
  end
  rcall("XTRIM", ctx.events, "MINID", nowMs - tonumber(ctx.eventsRetention))
  rcall("XTRIM", ctx.events, "MAXLEN", "~", ctx.eventsMax)
end
