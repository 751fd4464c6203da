--[[
  Set or clear one rate limit of a queue (stored in its first shard's slot).
  Setting a limit keeps its bucket's tokens (capped at the new burst when
  next refilled); clearing removes the limit and its bucket. Idempotent: the
  same call again changes nothing.

  Input:
    KEYS[1] rates    sq:{<queue>}:rates    HASH "queue" | "client:<name>" -> "<per second>|<burst>"
    KEYS[2] buckets  sq:{<queue>}:buckets  HASH same fields -> "<tokens>|<ms>"
    ARGV[1] field: "queue" or "client:<name>"
    ARGV[2] "<per second>|<burst>", or "" to clear

  Output:
    1 when the stored limit changed, 0 when it already was so
]]
local rcall = redis.call
local ratesKey, bucketsKey = KEYS[1], KEYS[2]
local field, spec = ARGV[1], ARGV[2]

if spec == "" then
  rcall("HDEL", bucketsKey, field)
  return rcall("HDEL", ratesKey, field)
end
if rcall("HGET", ratesKey, field) == spec then return 0 end
rcall("HSET", ratesKey, field, spec)
return 1
