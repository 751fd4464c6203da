--[[
  Hand back small-job lane entries a worker read but never started (it is
  stopping, or its queue was paused; or their job was cancelled: the worker's
  heartbeat drops the entries of cancelled jobs it holds but never saw, of a
  read whose reply was lost, streamq/work/lane_unseen.py): each is copied to a new
  entry at the end of its lane stream, then acknowledged and deleted, so
  another worker reads it as new and no delivery is spent. An entry not pending with this
  consumer (reclaimed meanwhile) is left alone. An entry whose job is no
  longer active (cancelled meanwhile) is acknowledged and deleted, not copied.

  Input:
    KEYS[1] lane   sq:{<shard>}:lane:<prio>:<client>  STREAM
    KEYS[2] ljobs  sq:{<shard>}:ljobs    HASH job -> JSON record
    ARGV[1] consumer group name
    ARGV[2] consumer name (the worker id)
    ARGV[3..] entry ids

  Output:
    number of entries handed back
]]
local rcall = redis.call
local laneKey, ljobsKey = KEYS[1], KEYS[2]
local group, consumer = ARGV[1], ARGV[2]

--- @include "includes/lane_complete"

--- @include "includes/hand_back"

-- an entry without a job is handed back too (the reaper dead-letters it as malformed)
local function active(fields)
  for k = 1, #fields, 2 do
    if fields[k] == "j" then return lane_active(rcall("HGET", ljobsKey, fields[k + 1])) end
  end
  return true
end

return hand_back(laneKey, group, consumer, 3, active)
