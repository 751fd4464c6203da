--[[
  Submit small jobs (one sub-request each, streamq.lane) into one lane of a
  queue shard, in one call: each job's record, its entry in the lane stream
  and its place in the registry of unfinished jobs. Idempotent by job id: a
  job already recorded (this call sent again after a lost reply, or an id
  submitted before) is left alone and reported.

  Input:
    KEYS[1] lane     sq:{<shard>}:lane:<prio>:<client>  STREAM (+ consumer group ARGV[1])
    KEYS[2] lanes    sq:{<shard>}:lanes    ZSET "<prio>|<client>" -> priority
    KEYS[3] ljobs    sq:{<shard>}:ljobs    HASH job -> JSON record
    KEYS[4] lactive  sq:{<shard>}:lactive  ZSET job -> submit ms
    KEYS[5] wake     sq:{<shard>}:wake     LIST of wake-up signals
    ARGV[1] consumer group name
    ARGV[2] lane member "<prio>|<client>"
    ARGV[3] priority
    ARGV[4] cap on wake-up signals
    ARGV[5..] quadruples (job id, JSON record ending in "}" without `created`,
              payload type letter, payload bytes)

  Output:
    {created ms, then one code per job: 1 submitted now, 0 recorded before}
]]
local rcall = redis.call
local laneKey, lanesKey, ljobsKey, lactiveKey, wakeKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, member, cap = ARGV[1], ARGV[2], tonumber(ARGV[4])

--- @include "includes/now_ms"

local nowMs = now_ms()
if rcall("EXISTS", laneKey) == 0 then
  rcall("XGROUP", "CREATE", laneKey, group, "0", "MKSTREAM")
end
rcall("ZADD", lanesKey, ARGV[3], member)
local out, added = {nowMs}, 0
local created = ',"created":' .. nowMs .. '}'
for j = 5, #ARGV, 4 do
  local job = ARGV[j]
  if rcall("HSETNX", ljobsKey, job, string.sub(ARGV[j + 1], 1, -2) .. created) == 1 then
    rcall("XADD", laneKey, "*", "j", job, "t", ARGV[j + 2], "p", ARGV[j + 3])
    rcall("ZADD", lactiveKey, nowMs, job)
    added = added + 1
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
local have = rcall("LLEN", wakeKey)
local want = have + added
if want > cap then want = cap end
for _ = have + 1, want do
  rcall("LPUSH", wakeKey, "1")
end
return out
