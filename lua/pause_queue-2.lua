--[[
  Pause one shard of a queue: workers settle what they hold and claim nothing
  until it is resumed (settle reads the flag). Idempotent: a shard paused
  already keeps its pause's id, which is returned, so a pause sent again (or a
  second pause) waits for the same acknowledgements.

  Input:
    KEYS[1] paused  sq:{<queue>}:paused  STRING the pause's id while paused
    KEYS[2] wake    sq:{<queue>}:wake    LIST of wake-up signals
    ARGV[1] the id of this pause (a random token)
    ARGV[2] wake-up signals to push (one per slot that may be idle), capped

  Output:
    the id of the pause in force
]]
local rcall = redis.call
local pausedKey, wakeKey = KEYS[1], KEYS[2]

--- @include "includes/push_signals"

if rcall("SET", pausedKey, ARGV[1], "NX") then
  -- idle slots settle at once and see it
  push_signals(wakeKey, tonumber(ARGV[2]) - rcall("LLEN", wakeKey))
end
return rcall("GET", pausedKey)
