--[[
  A job got deliverable work (sub-requests added, a retry due, entries
  reclaimed): move its parked tokens back to ready, and mark its leased
  tokens as kicked so a worker about to park one sends it to ready instead.

  Input:
    KEYS[1] parked  sq:{<queue>}:parked  ZSET token -> score
    KEYS[2] ready   sq:{<queue>}:ready   ZSET token -> score
    KEYS[3] leased  sq:{<queue>}:leased  ZSET token -> lease deadline ms
    KEYS[4] kick    sq:{<queue>}:kick    HASH token -> 1
    KEYS[5] wake    sq:{<queue>}:wake    LIST of wake-up signals
    ARGV[1] job id
    ARGV[2] concurrency (number of tokens the job has)
    ARGV[3] cap on wake-up signals

  Output:
    number of tokens moved back to ready
]]
local rcall = redis.call
local parkedKey, readyKey, leasedKey, kickKey, wakeKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local job = ARGV[1]

--- @include "includes/signal_ready"

local moved = 0
for i = 0, tonumber(ARGV[2]) - 1 do
  local tok = job .. "#" .. i
  local score = rcall("ZSCORE", parkedKey, tok)
  if score then
    rcall("ZREM", parkedKey, tok)
    rcall("ZADD", readyKey, score, tok)
    moved = moved + 1
  elseif rcall("ZSCORE", leasedKey, tok) then
    rcall("HSET", kickKey, tok, 1)
  end
end
if moved > 0 then signal_ready(readyKey, wakeKey, tonumber(ARGV[3])) end
return moved
