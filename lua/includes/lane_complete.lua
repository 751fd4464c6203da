--[[
  A small job's record (streamq.lane) is JSON whose first fields are the ones
  that change, always in this order, so a script rewrites them as text and
  reads the rest with a pattern, without decoding the document:
  {"state":"active","done":0,"failed":0,<the settings>,"created":<ms>} while
  it runs; {"state":"<terminal>","done":d,"failed":f,"finished":<ms>,<the same>}
  once it completed. lane_active tells a record that is still running.

  A finished job is kept for its retention: lane_flush appends one entry per
  call (and retention) to `lkept`, a STREAM whose entry id is the time the jobs
  may be forgotten (Redis's clock at the finish + their retention) and whose
  fields are "r" (that retention, ms) and "j" (the job ids, space-separated):
  about 25 bytes a job, where a ZSET member costs 130. A stream's ids only
  grow, so a job whose forget-after time is below the stream's last id (a
  shorter retention than the jobs before it) goes to `ldone` instead, a ZSET
  job -> forget-after ms. lane_trim reads both by Redis's clock. An entry
  may name a job since retried and finished again (a later entry names it
  then): a job is forgotten only when its record is terminal and its own
  finish + the entry's retention has passed.

  A job that succeeded keeps a short record instead, with its result in it (no
  `lresults` field): "S<finished ms>|<ms from created to finished>", then, when
  one of them is not the default (50, "default", 5),
  "|<priority>|<client>|<max_deliveries>", then a newline and the encoded result
  when it is at most LANE_INLINE bytes (a bigger one goes to `lresults`, so a
  status read never carries it; streamq.producer.lane.parse reads every form). A retained small job is most
  of what a queue keeps: this one costs about 150 bytes less than the JSON and a
  result field. A job retried in place keeps the JSON (its retry token, which
  tells a resent retry, is in it) and its result in `lresults`.
]]
--- @include "includes/chunked"
--- @include "includes/int_text"

local LANE_ACTIVE = '{"state":"active","done":0,"failed":0,'

-- what lane_complete leaves for lane_flush (see below)
local function lane_done()
  return {records = {}, jobs = {}, kept = {}, order = {}}
end

local function lane_active(raw)
  return raw ~= nil and raw ~= false and string.sub(raw, 1, #LANE_ACTIVE) == LANE_ACTIVE
end

local LANE_CANCELLED = '{"state":"cancelled",'

-- a record cancelled while its entry was held by a worker (lane_cancel)
local function lane_cancelled(raw)
  return raw ~= nil and raw ~= false and string.sub(raw, 1, #LANE_CANCELLED) == LANE_CANCELLED
end

-- the digits of a number field of a record ("0" when it has none): a plain search for
-- its name (the record's fields are flat and their names are never values)
local function lane_digits(raw, name)
  local key = '"' .. name .. '":'
  local at = string.find(raw, key, 1, true)
  if not at then return "0" end
  return string.match(raw, "^%d+", at + #key) or "0"
end

-- the lane member "<prio>|<client>" a record names: the lane its entry or retry is in
local function lane_member_of(raw)
  return lane_digits(raw, "priority") .. "|" .. tostring(string.match(raw, '"client":"([^"]*)"'))
end

-- a number field of a record, as a number (0 when it has none)
local function lane_field(raw, name)
  return tonumber(lane_digits(raw, name))
end

-- ctx.now: the text of `nowMs`; ctx.forget: forget-after texts by retention digits,
-- made once per call (includes/int_text)
local function lane_texts(ctx, nowMs)
  if ctx.nowMs ~= nowMs then
    ctx.nowMs, ctx.now, ctx.forget = nowMs, int_text(nowMs), {}
  end
  return ctx.now
end

--[[
  Complete a small job in its shard's slot: its record turns terminal, it
  leaves the registry of unfinished jobs, is kept for its retention in
  `ldone`, and its completion is recorded in the events stream and published
  on the job's and the queue's channels, all in the caller's script. `raw` is
  the job's active record; `ctx` holds the keys and settings every lane script
  passes: ljobs, lactive, ldone, events, eventsMax, eventsRetention,
  queueChannel, jobChannel (built from
  the tag the guard checked), queue; and `ctx.done`, the writes to the
  records, the registry and `ldone`, which lane_flush makes with one command
  each for every job the call completed (call it before the script returns).
  The caller has made sure this happens once (only the call whose XACK
  acknowledged the job's entry completes it).
]]
local LANE_INLINE = 1024

-- the settings of a record as submitted (made by lane_submit-5.lua, `created` last)
-- with nothing after them, read with one match: priority, client, retention,
-- max_deliveries, created (all text); nil for a record of another layout (a retry
-- token or a closer after them), which is read field by field
local LANE_PLAIN = '^"queue":"[^"]*","priority":(%d+),"client":"([^"]*)","retention":(%d+),' ..
  '"max_deliveries":(%d+),"created":(%d+)}$'

-- the short record of a job that succeeded with `result` (see the top); `prio`,
-- `client`, `maxd`, `created`: the record's settings when it is plain (LANE_PLAIN),
-- else nil (read from `rest` here)
local function lane_succeeded(rest, nowMs, now, result, prio, client, maxd, created)
  if prio then
    created = tonumber(created)
  else
    prio, maxd = lane_digits(rest, "priority"), lane_digits(rest, "max_deliveries")
    client = string.match(rest, '"client":"([^"]*)"') or "default"
    created = lane_field(rest, "created")
  end
  local settings = ""
  if prio ~= "50" or client ~= "default" or maxd ~= "5" then
    settings = "|" .. prio .. "|" .. client .. "|" .. maxd
  end
  local head = "S" .. now .. "|" .. int_text(nowMs - created) .. settings
  if #result > LANE_INLINE then return head, false end
  return head .. "\n" .. result, true
end

local function lane_complete(ctx, job, raw, state, done, failed, nowMs, result)
  local now = lane_texts(ctx, nowMs)
  done, failed = int_text(done), int_text(failed)
  local rest = string.sub(raw, #LANE_ACTIVE + 1)
  local d = ctx.done
  d.records[#d.records + 1] = job
  local kept = false
  -- a plain record (LANE_PLAIN) has no retry token: one match reads its settings
  local prio, client, retention, maxd, created = string.match(rest, LANE_PLAIN)
  if result ~= nil and (prio or not string.find(rest, '"retry":"', 1, true)) then
    -- succeeded: the short record (its result in it, unless a big one)
    d.records[#d.records + 1], kept = lane_succeeded(rest, nowMs, now, result, prio, client,
                                                     maxd, created)
  else
    d.records[#d.records + 1] = '{"state":"' .. state .. '","done":' .. done ..
      ',"failed":' .. failed .. ',"finished":' .. now .. ',' .. rest
  end
  d.jobs[#d.jobs + 1] = job
  if not prio then retention = lane_digits(rest, "retention") end
  local forget = ctx.forget[retention]
  if not forget then
    forget = int_text(nowMs + tonumber(retention))
    ctx.forget[retention] = forget
  end
  local group = d.kept[forget]
  if not group then
    group = {retention, {}}
    d.kept[forget] = group
    d.order[#d.order + 1] = forget
  end
  group[2][#group[2] + 1] = job
  rcall("XADD", ctx.events, "*", "job", job, "state", state, "total", "1", "done", done,
        "failed", failed, "finished", now)
  local message = '{"job_id":"' .. job .. '","queue":"' .. ctx.queue .. '","state":"' ..
    state .. '","total":1,"done":' .. done .. ',"failed":' .. failed .. ',"finished_ms":' ..
    now .. '}'
  sq_publish(ctx.jobChannel .. job, message)
  sq_publish(ctx.queueChannel, message)
  return kept
end

-- the jobs of one forget-after time in `lkept` (entries of at most 100 ids), or in
-- `ldone` when the stream's last id is past that time (see the top)
local function lane_keep(ctx, forget, retention, jobs)
  for i = 1, #jobs, 100 do
    local last = math.min(i + 99, #jobs)
    local added = redis.pcall("XADD", ctx.lkept, forget .. "-*", "r", retention,
                              "j", table.concat(jobs, " ", i, last))
    if type(added) == "table" and added.err then
      local members = {}
      for k = i, last do
        members[#members + 1] = forget
        members[#members + 1] = jobs[k]
      end
      chunked("ZADD", ctx.ldone, members)
    end
  end
end

local function lane_flush(ctx)
  local d = ctx.done
  if #d.jobs == 0 then return end
  chunked("HSET", ctx.ljobs, d.records)
  chunked("ZREM", ctx.lactive, d.jobs)
  if #d.order > 1 then
    table.sort(d.order, function(a, b) return tonumber(a) < tonumber(b) end)
  end
  for _, forget in ipairs(d.order) do
    local kept = d.kept[forget]
    lane_keep(ctx, forget, kept[1], kept[2])
  end
  ctx.done = lane_done()
end

--[[
  Dead-letter a small job's entry: one entry in the queue's dead-letter stream
  (it is in this slot: no second step), its error record in `lerrors` (naming
  that entry, `d`) with its payload beside it (field "<job>|p": its type letter,
  then its bytes), and the job completes as failed. The payload stays with the
  job, as a job's stream keeps its entries, so a retry in place runs it after its
  dead letter was purged or trimmed from the dead stream. `raw` is nil for an
  entry whose job has no active record (malformed, finished, or its record
  expired): only the dead letter is written.
]]
local function lane_dead(ctx, dead, deadMax, job, raw, entryId, errText, attempts, kind,
                         payload, nowMs)
  local created, field, serial = 0, "0", 1
  if raw then
    -- its serial: one past the dead letter its last retry in place put back (`dead`
    -- in the record, lane_retry), so each dead letter of the job is one of its own
    created, serial = lane_field(raw, "created"), lane_field(raw, "dead") + 1
  else
    field = "entry:" .. entryId
  end
  local deadId = rcall("XADD", dead, "MAXLEN", "~", deadMax, "*", "job", job or "",
                       "index", field, "error", errText, "attempts", attempts, "at", nowMs,
                       "t", kind or "b", "p", payload or "", "n", serial, "c", created)
  if raw then
    rcall("HSET", ctx.lerrors, job,
          cjson.encode({error = errText, attempts = tonumber(attempts), at = nowMs, n = serial,
                        d = deadId}),
          job .. "|p", (kind or "b") .. (payload or ""))
    lane_complete(ctx, job, raw, "failed", 0, 1, nowMs)
  end
end

-- the finish time of a terminal record (0 when it names none)
local function lane_finished(raw)
  if string.sub(raw, 1, 1) == "S" then
    return tonumber(string.match(raw, "^S(%d+)") or "0")
  end
  return lane_field(raw, "finished")
end

local function lane_forget(ctx, jobs)
  if #jobs == 0 then return end
  chunked("HDEL", ctx.ljobs, jobs)
  chunked("HDEL", ctx.lresults, jobs)
  -- (its error record and the payload lane_dead kept beside it)
  local errors = {}
  for _, j in ipairs(jobs) do
    errors[#errors + 1] = j
    errors[#errors + 1] = j .. "|p"
  end
  chunked("HDEL", ctx.lerrors, errors)
end

-- the jobs of `lkept` entries whose time passed (whole entries, about `limit` jobs):
-- forgotten when their record is terminal and its own time passed (see the top)
local function lane_trim_kept(ctx, nowMs, limit)
  local entries = rcall("XRANGE", ctx.lkept, "-", nowMs, "COUNT", math.max(1, math.floor(limit / 25)))
  if #entries == 0 then return end
  local names, retention = {}, {}
  for _, e in ipairs(entries) do
    local f = e[2]
    local r, list = 0, ""
    for k = 1, #f, 2 do
      if f[k] == "r" then r = tonumber(f[k + 1]) or 0 elseif f[k] == "j" then list = f[k + 1] end
    end
    for job in string.gmatch(list, "%S+") do
      names[#names + 1] = job
      retention[#names] = r
    end
  end
  local old = {}
  for n, raw in ipairs(chunked_hmget(ctx.ljobs, names)) do
    if raw and not lane_active(raw) and lane_finished(raw) + retention[n] <= nowMs then
      old[#old + 1] = names[n]
    end
  end
  lane_forget(ctx, old)
  -- MINID drops the entries below the one after the last read
  local ms, seq = string.match(entries[#entries][1], "^(%d+)-(%d+)$")
  if #seq < 15 then
    rcall("XTRIM", ctx.lkept, "MINID", ms .. "-" .. string.format("%.0f", tonumber(seq) + 1))
  else
    rcall("XTRIM", ctx.lkept, "MINID", string.format("%.0f", tonumber(ms) + 1) .. "-0")
  end
  -- an empty stream is deleted (a queue whose jobs are all forgotten leaves no key)
  if rcall("XLEN", ctx.lkept) == 0 then rcall("DEL", ctx.lkept) end
end

--[[
  Forget small jobs whose retention passed (at most about `limit` per call, from
  each of `ldone` and `lkept`), and trim the events stream by the queue's
  retention and its cap.
]]
local function lane_trim(ctx, nowMs, limit)
  local old = rcall("ZRANGEBYSCORE", ctx.ldone, "-inf", nowMs, "LIMIT", 0, limit)
  if #old > 0 then
    lane_forget(ctx, old)
    rcall("ZREM", ctx.ldone, unpack(old))
  end
  lane_trim_kept(ctx, nowMs, limit)
  rcall("XTRIM", ctx.events, "MINID", nowMs - tonumber(ctx.eventsRetention))
  rcall("XTRIM", ctx.events, "MAXLEN", "~", ctx.eventsMax)
end
