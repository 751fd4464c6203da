--[[
  Resume one shard of a queue: remove the pause and wake idle slots, which
  claim again at once. Resuming a shard that is not paused changes nothing.

  Input:
    KEYS[1] paused  sq:{<queue>}:paused  STRING the pause's id while paused
    KEYS[2] wake    sq:{<queue>}:wake    LIST of wake-up signals
    ARGV[1] wake-up signals to push (one per slot that may be idle), capped

  Output:
    1 when the shard was paused, else 0
]]
local rcall = redis.call
local pausedKey, wakeKey = KEYS[1], KEYS[2]

--- @include "includes/push_signals"

local was = rcall("DEL", pausedKey)
if was == 1 then
  push_signals(wakeKey, tonumber(ARGV[1]) - rcall("LLEN", wakeKey))
end
return was
