--[[
  Take a lock for a holder, or find it held by that holder still (a pass of its
  own cut short by a Redis error left it behind).

  Input:
    KEYS[1] lock  sq:{<queue>}:reaper-lock  STRING holder id, with a TTL
    ARGV[1] holder id
    ARGV[2] lock lifetime, ms (given to a lock taken now; a held lock keeps its own)

  Output:
    1 taken now or held by this holder, 0 held by another
]]
local rcall = redis.call
local lockKey = KEYS[1]
local holder, ttlMs = ARGV[1], ARGV[2]
if rcall("SET", lockKey, holder, "NX", "PX", ttlMs) then
  return 1
end
if rcall("GET", lockKey) == holder then
  return 1
end
return 0
