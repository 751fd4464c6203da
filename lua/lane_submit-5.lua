--[[
  Submit small jobs (one sub-request each, streamq.lane) into one lane of a
  queue shard, in one call: each job's record, its entry in the lane stream
  and its place in the registry of unfinished jobs. Idempotent by job id: a
  job already recorded (this call sent again after a lost reply, or an id
  submitted before) is left alone and reported.

  Each job's record is made here, from the checked arguments (the one layout
  lua/includes/lane_complete.lua reads): the caller names the lane, the
  retention and max_deliveries, never the record itself, so no call can store
  a record that a status read, a worker or the reaper could not read.

  Input:
    KEYS[1] lane     sq:{<shard>}:lane:<prio>:<client>  STREAM (+ consumer group ARGV[1])
    KEYS[2] lanes    sq:{<shard>}:lanes    ZSET "<prio>|<client>" -> priority
    KEYS[3] ljobs    sq:{<shard>}:ljobs    HASH job -> JSON record
    KEYS[4] lactive  sq:{<shard>}:lactive  ZSET job -> submit ms
    KEYS[5] wake     sq:{<shard>}:wake     LIST of wake-up signals
    ARGV[1] consumer group name
    ARGV[2] lane member "<prio>|<client>": KEYS[1] is its lane (the guard checks)
    ARGV[3] cap on wake-up signals
    ARGV[4] the jobs' retention, ms
    ARGV[5] the jobs' max_deliveries
    ARGV[6..] triples (job id, payload type letter, payload bytes), optionally
              followed by one trace context (a W3C traceparent) the entries carry in
              field "c"

  Output:
    {created ms, then one code per job: 1 submitted now, 0 recorded before}
]]
local rcall = redis.call
local laneKey, lanesKey, ljobsKey, lactiveKey, wakeKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, member, cap = ARGV[1], ARGV[2], tonumber(ARGV[3])
local prio, client = string.match(member, "^(%d+)|(.*)$")

--- @include "includes/now_ms"
--- @include "includes/chunked"
--- @include "includes/int_text"
--- @include "includes/push_signals"

-- a job's entry; the lane stream and its group are made at the first entry that finds
-- none (XADD NOMKSTREAM adds nothing then). A lane stream exists exactly while it
-- is registered (lane_drop removes both in one call; lane_promote makes both)
local function lane_add(j, kind, payload, ctx)
  local id
  if ctx then
    id = rcall("XADD", laneKey, "NOMKSTREAM", "*", "j", j, "t", kind, "p", payload, "c", ctx)
  else
    id = rcall("XADD", laneKey, "NOMKSTREAM", "*", "j", j, "t", kind, "p", payload)
  end
  if id then return end
  rcall("XGROUP", "CREATE", laneKey, group, "0", "MKSTREAM")
  rcall("ZADD", lanesKey, prio, member)
  lane_add(j, kind, payload, ctx)
end

local nowMs = now_ms()
local out, added = {nowMs}, 0
local now = int_text(nowMs)  -- once for every job (includes/int_text)
-- the record of every job of this call (streamq.producer.lane.parse reads it): its
-- numbers written as integers (int_text; the guard holds the member's priority to one
-- with no leading zero), its names checked by the guard (no JSON escape needed), its
-- queue the tag
local record = '{"state":"active","done":0,"failed":0,"queue":"' .. SQ_TAG ..
  '","priority":' .. prio .. ',"client":"' .. client ..
  '","retention":' .. int_text(tonumber(ARGV[4])) ..
  ',"max_deliveries":' .. int_text(tonumber(ARGV[5])) .. ',"created":' .. now .. '}'
-- the records read with one command (a job recorded before is left alone), the new
-- records and registry entries written with one command each; one job alone (a
-- submit one at a time) is recorded by HSETNX, which tells whether it was before
local last, ctx = #ARGV, nil
if (last - 5) % 3 == 1 then
  ctx = ARGV[last]
  last = last - 1
end
local ids = {}
for j = 6, last, 3 do ids[#ids + 1] = ARGV[j] end
local one = #ids == 1
local known
if one then
  known = {rcall("HSETNX", ljobsKey, ids[1], record) == 0}
else
  known = chunked_hmget(ljobsKey, ids)
end
local records, registry, seen = {}, {}, {}
for n, j in ipairs(ids) do
  local at = 6 + (n - 1) * 3
  if known[n] or seen[j] then
    out[#out + 1] = 0
  else
    seen[j] = true
    if not one then
      records[#records + 1] = j
      records[#records + 1] = record
    end
    registry[#registry + 1] = now
    registry[#registry + 1] = j
    local ok, err = pcall(lane_add, j, ARGV[at + 1], ARGV[at + 2], ctx)
    if not ok then
      -- (the entry could not be added: the record HSETNX wrote goes too, so a resend
      -- meets the same error instead of a job recorded with no entry)
      if one then rcall("HDEL", ljobsKey, j) end
      if type(err) == "table" then return err end
      return redis.error_reply(tostring(err))
    end
    added = added + 1
    out[#out + 1] = 1
  end
end
chunked("HSET", ljobsKey, records)
chunked("ZADD", lactiveKey, registry)
-- a wake-up signal per job submitted now, up to `cap` waiting
local have = rcall("LLEN", wakeKey)
push_signals(wakeKey, math.min(have + added, cap) - have)
return out
