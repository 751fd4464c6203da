--[[
  Release a lock only if this holder still owns it (compare and delete).

  Input:
    KEYS[1] lock  sq:{<queue>}:reaper-lock  STRING holder id, with a TTL
    ARGV[1] holder id

  Output:
    1 released, 0 held by another (or expired)
]]
local rcall = redis.call
local lockKey = KEYS[1]
if rcall("GET", lockKey) == ARGV[1] then
  return rcall("DEL", lockKey)
end
return 0
