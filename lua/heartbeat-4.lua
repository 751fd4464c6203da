--[[
  A worker's heartbeat: refresh its entry in the worker registry and its
  description, and extend the leases it still owns.

  Input:
    KEYS[1] workers  sq:{<queue>}:workers        ZSET worker -> heartbeat deadline ms
    KEYS[2] worker   sq:{<queue>}:worker:<id>    HASH describing the worker
    KEYS[3] leased   sq:{<queue>}:leased         ZSET token -> lease deadline ms
    KEYS[4] owners   sq:{<queue>}:owners         HASH token -> worker id
    ARGV[1] worker id
    ARGV[2] heartbeat lifetime, ms: the worker counts as alive until Redis's
            clock passes now + this
    ARGV[3] lease length, ms: each lease it still owns is extended to now + this
    ARGV[4] lifetime of the description hash, ms
    ARGV[5] number n of description field/value pairs that follow
    ARGV[6 .. 5+2n] description pairs
    ARGV[6+2n ..] tokens the worker believes it holds

  Output:
    the tokens among them this worker no longer owns (reclaimed by the reaper)
]]
local rcall = redis.call
local workersKey, workerKey, leasedKey, ownersKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local worker = ARGV[1]
local n = tonumber(ARGV[5])

--- @include "includes/now_ms"

local nowMs = now_ms()
rcall("ZADD", workersKey, nowMs + tonumber(ARGV[2]), worker)
local leaseDeadline = nowMs + tonumber(ARGV[3])
for j = 6, 5 + 2 * n, 2 do
  rcall("HSET", workerKey, ARGV[j], ARGV[j + 1])
end
rcall("PEXPIRE", workerKey, ARGV[4])

local lost = {}
for j = 6 + 2 * n, #ARGV do
  local tok = ARGV[j]
  if rcall("HGET", ownersKey, tok) == worker then
    rcall("ZADD", leasedKey, "XX", leaseDeadline, tok)
  else
    lost[#lost + 1] = tok
  end
end
return lost
