--[[
  A worker's heartbeat: refresh its entry in the worker registry and its
  description (with the time of this beat, Redis's clock), and extend the
  leases its slots still own.

  Input:
    KEYS[1] workers  sq:{<queue>}:workers        ZSET worker -> heartbeat deadline ms
    KEYS[2] worker   sq:{<queue>}:worker:<id>    HASH describing the worker
    KEYS[3] leased   sq:{<queue>}:leased         ZSET token -> lease deadline ms
    KEYS[4] owners   sq:{<queue>}:owners         HASH token -> "<worker id>/<slot>"
    ARGV[1] worker id
    ARGV[2] heartbeat lifetime, ms (the worker is dead once it passed without a beat)
    ARGV[3] lease length, ms
    ARGV[4] lifetime of the description hash, ms
    ARGV[5] number n of description field/value pairs that follow
    ARGV[6 .. 5+2n] description pairs
    ARGV[6+2n ..] pairs (token, owner "<worker id>/<slot>") the worker's slots believe
                  they hold

  Output:
    the tokens among them whose owner is no longer that slot (reclaimed by the reaper)

  The description gets the field "beat": the time of this beat, ms since the epoch.
]]
local rcall = redis.call
local workersKey, workerKey, leasedKey, ownersKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local worker = ARGV[1]
local n = tonumber(ARGV[5])

--- @include "includes/now_ms"

local nowMs = now_ms()
rcall("ZADD", workersKey, nowMs + tonumber(ARGV[2]), worker)
for j = 6, 5 + 2 * n, 2 do
  rcall("HSET", workerKey, ARGV[j], ARGV[j + 1])
end
rcall("HSET", workerKey, "beat", nowMs)
rcall("PEXPIRE", workerKey, ARGV[4])

local deadline = nowMs + tonumber(ARGV[3])
local lost = {}
for j = 6 + 2 * n, #ARGV, 2 do
  local tok = ARGV[j]
  if rcall("HGET", ownersKey, tok) == ARGV[j + 1] then
    rcall("ZADD", leasedKey, "XX", deadline, tok)
  else
    lost[#lost + 1] = tok
  end
end
return lost
