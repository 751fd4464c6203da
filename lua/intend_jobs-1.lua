--[[
  Record the intent to create jobs, in the queue's hash slot, ahead of their
  job-slot create (sent in the same pipelined round trip, before it). An
  intent is the durable first step of the cross-slot submit: register_jobs
  or finish_jobs removes it; one left behind by a producer that died between
  the two steps is finished by the reaper (recover_intents). Idempotent: an
  intent already recorded keeps its time.

  Input:
    KEYS[1] creating  sq:{<queue>}:creating  ZSET intent -> time written, ms (Redis's clock)
    ARGV[1..] intents: the job id, or "<job>|<dedup key>" for a job with a dedup key

  Output:
    how many intents this call added
]]
local rcall = redis.call
local creatingKey = KEYS[1]

--- @include "includes/now_ms"

local nowMs = now_ms()
local added = 0
for i = 1, #ARGV, 250 do
  local args = {"NX"}
  for j = i, math.min(i + 249, #ARGV) do
    args[#args + 1] = nowMs
    args[#args + 1] = ARGV[j]
  end
  added = added + rcall("ZADD", creatingKey, unpack(args))
end
return added
