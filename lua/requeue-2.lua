--[[
  Hand back entries a worker read but never started (it is draining): each
  is copied to a new entry at the end of the stream, then acknowledged and
  deleted, so another worker reads it as new and no delivery is spent.
  An entry not pending with this consumer (reclaimed meanwhile) is left alone.
  An entry of a cancelled job is acknowledged and deleted, not copied: nothing
  of a cancelled job starts again.

  Input:
    KEYS[1] tasks  sq:{<queue>/<job>}:tasks  STREAM
    KEYS[2] meta   sq:{<queue>/<job>}:meta   HASH
    ARGV[1] consumer group name
    ARGV[2] consumer name (the worker id)
    ARGV[3..] entry ids

  Output:
    number of entries handed back
]]
local rcall = redis.call
local tasksKey, metaKey = KEYS[1], KEYS[2]
local group, consumer = ARGV[1], ARGV[2]
local cancelled = rcall("HGET", metaKey, "state") == "cancelled"

--- @include "includes/hand_back"

local moved = hand_back(tasksKey, group, consumer, 3,
                        function() return not cancelled end)
if cancelled and rcall("XLEN", tasksKey) == 0 then rcall("DEL", tasksKey) end
return moved
