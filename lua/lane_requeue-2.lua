--[[
  Hand back small-job lane entries a worker read but never started (it is
  stopping, or its queue was paused): each is copied to a new entry at the
  end of its lane stream, then acknowledged and deleted, so another worker
  reads it as new and no delivery is spent. An entry not pending with this
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

local moved = 0
for j = 3, #ARGV do
  local id = ARGV[j]
  local pending = rcall("XPENDING", laneKey, group, id, id, 1, consumer)
  local entry = rcall("XRANGE", laneKey, id, id)
  if #pending == 1 and #entry == 1 then
    rcall("XACK", laneKey, group, id)
    rcall("XDEL", laneKey, id)
    local fields = entry[1][2]
    local job = nil
    for k = 1, #fields, 2 do
      if fields[k] == "j" then job = fields[k + 1] end
    end
    if job == nil or lane_active(rcall("HGET", ljobsKey, job)) then
      local args = {"XADD", laneKey, "*"}
      for k = 1, #fields do args[#args + 1] = fields[k] end
      rcall(unpack(args))
      moved = moved + 1
    end
  end
end
return moved
