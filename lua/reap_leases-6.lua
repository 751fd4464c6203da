--[[
  Return expired leases to ready and forget dead workers. A lease is expired
  when its deadline passed or its holder's heartbeat did; a worker is dead
  when its heartbeat deadline passed. A token whose job finished meanwhile
  is dropped instead of returned.

  Input:
    KEYS[1] workers  sq:{<queue>}:workers  ZSET worker -> heartbeat deadline ms
    KEYS[2] leased   sq:{<queue>}:leased   ZSET token -> lease deadline ms
    KEYS[3] owners   sq:{<queue>}:owners   HASH token -> "<worker id>/<slot>"
    KEYS[4] tokens   sq:{<queue>}:tokens   HASH token -> score
    KEYS[5] ready    sq:{<queue>}:ready    ZSET token -> score
    KEYS[6] wake     sq:{<queue>}:wake     LIST of wake-up signals
    ARGV[1] cap on wake-up signals
    ARGV[2] most leases to return in this call

  Output:
    {returned leases, dead worker ids...}
]]
local rcall = redis.call
local workersKey, leasedKey, ownersKey, tokensKey, readyKey, wakeKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local cap, limit = tonumber(ARGV[1]), tonumber(ARGV[2])

--- @include "includes/signal_ready"
--- @include "includes/now_ms"

local nowMs = now_ms()

local dead = rcall("ZRANGEBYSCORE", workersKey, "-inf", "(" .. nowMs, "LIMIT", 0, 1000)
local isDead = {}
for _, w in ipairs(dead) do isDead[w] = true end

local function release(tok)
  rcall("ZREM", leasedKey, tok)
  rcall("HDEL", ownersKey, tok)
  local score = rcall("HGET", tokensKey, tok)
  if score then rcall("ZADD", readyKey, score, tok) end
end

local returned = 0
for _, tok in ipairs(rcall("ZRANGEBYSCORE", leasedKey, "-inf", "(" .. nowMs, "LIMIT", 0, limit)) do
  release(tok)
  returned = returned + 1
end
if #dead > 0 then
  local owners = rcall("HGETALL", ownersKey)
  for j = 1, #owners, 2 do
    local holder = owners[j + 1]
    if isDead[string.match(holder, "^(.*)/%d+$") or holder] then
      release(owners[j])
      returned = returned + 1
    end
  end
  for _, w in ipairs(dead) do rcall("ZREM", workersKey, w) end
end
if returned > 0 then signal_ready(readyKey, wakeKey, cap) end

local out = {returned}
for _, w in ipairs(dead) do out[#out + 1] = w end
return out
