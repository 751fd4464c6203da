--[[
  Hand back entries a worker read but never started (it is draining): each
  is copied to a new entry at the end of the stream, then acknowledged and
  deleted, so another worker reads it as new and no delivery is spent.
  An entry this consumer no longer has pending is left alone.

  Input:
    KEYS[1] tasks  sq:{<job>}:tasks  STREAM
    KEYS[2] meta   sq:{<job>}:meta   HASH
    ARGV[1] consumer group name
    ARGV[2..] entry ids

  Output:
    number of entries handed back
]]
local rcall = redis.call
local tasksKey, metaKey = KEYS[1], KEYS[2]
local group = ARGV[1]

local moved = 0
for j = 2, #ARGV do
  local id = ARGV[j]
  local entry = rcall("XRANGE", tasksKey, id, id)
  if #entry == 1 and rcall("XACK", tasksKey, group, id) == 1 then
    rcall("XDEL", tasksKey, id)
    local fields = entry[1][2]
    local args = {"XADD", tasksKey, "*"}
    for k = 1, #fields do args[#args + 1] = fields[k] end
    rcall(unpack(args))
    moved = moved + 1
  end
end
return moved
