--[[
  Remove an orphan from its queue: a registered job whose own keys are gone
  (expired or deleted). Its tokens (<job>#0, #1, ... up to the first one
  missing) leave every token structure. No completion is recorded.

  Input:
    KEYS[1] active  sq:{<queue>}:active  ZSET
    KEYS[2] tokens  sq:{<queue>}:tokens  HASH
    KEYS[3] ready   sq:{<queue>}:ready   ZSET
    KEYS[4] leased  sq:{<queue>}:leased  ZSET
    KEYS[5] parked  sq:{<queue>}:parked  ZSET
    KEYS[6] owners  sq:{<queue>}:owners  HASH
    KEYS[7] kick    sq:{<queue>}:kick    HASH
    ARGV[1] job id

  Output:
    number of tokens removed
]]
local rcall = redis.call
local activeKey, tokensKey, readyKey, leasedKey, parkedKey, ownersKey, kickKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local job = ARGV[1]

rcall("ZREM", activeKey, job)
local i = 0
while rcall("HDEL", tokensKey, job .. "#" .. i) == 1 do
  local tok = job .. "#" .. i
  rcall("ZREM", readyKey, tok)
  rcall("ZREM", leasedKey, tok)
  rcall("ZREM", parkedKey, tok)
  rcall("HDEL", ownersKey, tok)
  rcall("HDEL", kickKey, tok)
  i = i + 1
end
return i
