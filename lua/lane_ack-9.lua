--[[
  Acknowledge small jobs (streamq.lane) and complete them, in one call: for
  each entry XACK acknowledged, its result is stored, the job's record turns
  succeeded and its completion is recorded and published once. An entry XACK
  did not acknowledge (settled before: a resent call, or reclaimed from a
  worker presumed dead) changes nothing, and an entry listed twice counts once.
  The job each triple names is taken as the entry's (a worker is trusted with
  results: reading every entry back would copy its payload into the call).
  Acknowledged entries are deleted (includes/delete_settled: those below the lane's oldest pending entry by one
  XTRIM, as every lane script that settles an entry deletes it). The
  result of an entry whose job was cancelled while it ran is stored and counted
  in the record (`done`); the job stays cancelled.
  Finished jobs whose retention passed are forgotten (a bounded number per call).

  Input:
    KEYS[1] lane     sq:{<shard>}:lane:<prio>:<client>  STREAM
    KEYS[2] ljobs    sq:{<shard>}:ljobs     HASH job -> JSON record
    KEYS[3] lresults sq:{<shard>}:lresults  HASH job -> encoded result
    KEYS[4] lerrors  sq:{<shard>}:lerrors   HASH job -> JSON error record
    KEYS[5] lstarts  sq:{<shard>}:lstarts   HASH entry id -> consumer
    KEYS[6] lactive  sq:{<shard>}:lactive   ZSET job -> submit ms
    KEYS[7] ldone    sq:{<shard>}:ldone     ZSET job -> forget-after ms
    KEYS[8] events   sq:{<shard>}:events    STREAM of completion records
    KEYS[9] lkept    sq:{<shard>}:lkept     STREAM id forget-after ms -> r, j (lane_complete)
    ARGV[1] consumer group name
    ARGV[2] cap on the events stream length (approximate)
    ARGV[3] events retention, ms
    ARGV[4..] triples (entry id, job id, encoded result)

  Output:
    {acknowledged, completed}: entries this call acknowledged, jobs it completed
]]
local rcall = redis.call
local ctx = {lane = KEYS[1], ljobs = KEYS[2], lresults = KEYS[3], lerrors = KEYS[4],
             lstarts = KEYS[5], lactive = KEYS[6], ldone = KEYS[7], events = KEYS[8],
             lkept = KEYS[9],
             eventsMax = ARGV[2], eventsRetention = ARGV[3],
             queueChannel = sq_channel(SQ_TAG), jobChannel = sq_channel(SQ_TAG) .. ":",
             queue = sq_queue_of(SQ_TAG)}
local group = ARGV[1]

--- @include "includes/now_ms"
--- @include "includes/chunked"
--- @include "includes/lane_complete"
--- @include "includes/delete_settled"

local nowMs = now_ms()
ctx.done = lane_done()
local acked, completed, ids, jobs = 0, 0, {}, {}
local starts = rcall("EXISTS", ctx.lstarts) == 1
-- one XACK of every id (chunked); when it acknowledged them all (the usual case)
-- each counts; otherwise some were settled before this call, or an id is listed
-- twice, and since every script that settles a lane entry deletes it in the same
-- call, the ones this call acknowledged are those still in the stream, each once
for j = 4, #ARGV, 3 do ids[#ids + 1] = ARGV[j] end
local ackedNow = 0
for i = 1, #ids, 500 do
  ackedNow = ackedNow + rcall("XACK", ctx.lane, group, unpack(ids, i, math.min(i + 499, #ids)))
end
local all = ackedNow == #ids
local mine, seen = {}, {}
for j = 4, #ARGV, 3 do
  if all or (not seen[ARGV[j]] and #rcall("XRANGE", ctx.lane, ARGV[j], ARGV[j]) > 0) then
    mine[#mine + 1] = j
    jobs[#jobs + 1] = ARGV[j + 1]
  end
  seen[ARGV[j]] = true
end
-- the records read with one command; a job that succeeded keeps its result in its
-- record, one cancelled while it ran (or retried in place) in `lresults`
local records, results = chunked_hmget(ctx.ljobs, jobs), {}
ids = {}
for n, j in ipairs(mine) do
  acked = acked + 1
  ids[#ids + 1] = ARGV[j]
  local raw = records[n]
  if lane_active(raw) then
    if not lane_complete(ctx, ARGV[j + 1], raw, "succeeded", 1, 0, nowMs, ARGV[j + 2]) then
      results[#results + 1] = ARGV[j + 1]  -- (a job retried in place: see lane_complete)
      results[#results + 1] = ARGV[j + 2]
    end
    completed = completed + 1
  elseif lane_cancelled(raw) then
    -- it was running when its job was cancelled: its result is kept and counted,
    -- nothing completes
    results[#results + 1] = ARGV[j + 1]
    results[#results + 1] = ARGV[j + 2]
    local none = '{"state":"cancelled","done":0,'
    if string.sub(raw, 1, #none) == none then
      rcall("HSET", ctx.ljobs, ARGV[j + 1],
            '{"state":"cancelled","done":1,' .. string.sub(raw, #none + 1))
    end
  end
end
if #results > 0 then chunked("HSET", ctx.lresults, results) end
lane_flush(ctx)
if #ids > 0 then delete_settled(ctx.lane, group, ids) end
if starts then chunked("HDEL", ctx.lstarts, ids) end
lane_trim(ctx, nowMs, 100)
return {acked, completed}
