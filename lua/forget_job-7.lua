--[[
  Remove an orphan from its queue: a registered job whose own keys are gone
  (expired or deleted). Every token it may have (<job>#0 .. #(n-1), n the
  most tokens a job can have, since its concurrency went with its meta)
  leaves every token structure, whichever of them are missing already (a
  worker drops a token of a job without meta one by one). No completion is
  recorded.

  Input:
    KEYS[1] active  sq:{<queue>}:active  ZSET
    KEYS[2] tokens  sq:{<queue>}:tokens  HASH
    KEYS[3] ready   sq:{<queue>}:ready   ZSET
    KEYS[4] leased  sq:{<queue>}:leased  ZSET
    KEYS[5] parked  sq:{<queue>}:parked  ZSET
    KEYS[6] owners  sq:{<queue>}:owners  HASH
    KEYS[7] kick    sq:{<queue>}:kick    HASH
    ARGV[1] job id
    ARGV[2] most tokens a job can have (config.MAX_CONCURRENCY)

  Output:
    number of tokens removed from `tokens`
]]
local rcall = redis.call
local activeKey, tokensKey, readyKey, leasedKey, parkedKey, ownersKey, kickKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local job, most = ARGV[1], tonumber(ARGV[2])

--- @include "includes/chunked"

rcall("ZREM", activeKey, job)
local toks = {}
for i = 0, most - 1 do
  toks[#toks + 1] = job .. "#" .. i
end
local removed = chunked("HDEL", tokensKey, toks)
chunked("ZREM", readyKey, toks)
chunked("ZREM", leasedKey, toks)
chunked("ZREM", parkedKey, toks)
chunked("HDEL", ownersKey, toks)
chunked("HDEL", kickKey, toks)
return removed
