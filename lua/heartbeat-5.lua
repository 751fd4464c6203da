--[[
  A worker's heartbeat: refresh its entry in the worker registry and its
  description (with the time of this beat, Redis's clock), extend the leases
  its slots still own, and (on the queue's first shard) add what its slots did
  since its last counted beat to the queue's stats stream.

  Input:
    KEYS[1] workers  sq:{<queue>}:workers        ZSET worker -> heartbeat deadline ms
    KEYS[2] worker   sq:{<queue>}:worker:<id>    HASH describing the worker
    KEYS[3] leased   sq:{<queue>}:leased         ZSET token -> lease deadline ms
    KEYS[4] owners   sq:{<queue>}:owners         HASH token -> "<worker id>/<slot>"
    KEYS[5] stats    sq:{<queue>}:stats          STREAM of per-beat counts (streamq.history)
    ARGV[1] worker id
    ARGV[2] heartbeat lifetime, ms (the worker is dead once it passed without a beat)
    ARGV[3] lease length, ms
    ARGV[4] lifetime of the description hash, ms
    ARGV[5] stats batch: "<process nonce>:<sequence number>", or "" when the beat
            carries no counts
    ARGV[6] stats window, ms: entries older than now minus this are trimmed (MINID ~),
            and the stream expires this long after its last entry
    ARGV[7] number m of stats field/value pairs that follow
    ARGV[8 .. 7+2m] stats pairs (started, finished, failed, w<bound ms> ...)
    ARGV[8+2m] number n of description field/value pairs that follow
    ARGV[9+2m .. 8+2m+2n] description pairs
    ARGV[9+2m+2n ..] pairs (token, owner "<worker id>/<slot>") the worker's slots believe
                  they hold

  Output:
    the tokens among them whose owner is no longer that slot (reclaimed by the reaper)

  The description gets the field "beat": the time of this beat, ms since the epoch.
  A stats batch is added once: the description keeps the last batch taken
  ("statseq"), and a batch of the same process whose sequence number is not
  above it (a beat sent again after its reply was lost) adds nothing.
]]
local rcall = redis.call
local workersKey, workerKey, leasedKey, ownersKey, statsKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local worker, batch = ARGV[1], ARGV[5]
local m = tonumber(ARGV[7])
local descAt = 8 + 2 * m
local n = tonumber(ARGV[descAt])

--- @include "includes/now_ms"

local nowMs = now_ms()
rcall("ZADD", workersKey, nowMs + tonumber(ARGV[2]), worker)

if batch ~= "" and m > 0 then
  local nonce, seq = string.match(batch, "^(.*):(%d+)$")
  local last = rcall("HGET", workerKey, "statseq")
  local taken = false
  if last and nonce then
    local lastNonce, lastSeq = string.match(last, "^(.*):(%d+)$")
    taken = lastNonce == nonce and tonumber(lastSeq) >= tonumber(seq)
  end
  if nonce and not taken then
    local window = tonumber(ARGV[6])
    -- (unpacked whole: the three counts and the histogram buckets, a few dozen at most)
    rcall("XADD", statsKey, "MINID", "~", nowMs - window, "*", "worker", worker,
          unpack(ARGV, 8, 7 + 2 * m))
    rcall("PEXPIRE", statsKey, window)
    rcall("HSET", workerKey, "statseq", batch)
  end
end

for j = descAt + 1, descAt + 2 * n, 2 do
  rcall("HSET", workerKey, ARGV[j], ARGV[j + 1])
end
rcall("HSET", workerKey, "beat", nowMs)
rcall("PEXPIRE", workerKey, ARGV[4])

local deadline = nowMs + tonumber(ARGV[3])
local lost = {}
for j = descAt + 1 + 2 * n, #ARGV, 2 do
  local tok = ARGV[j]
  if rcall("HGET", ownersKey, tok) == ARGV[j + 1] then
    rcall("ZADD", leasedKey, "XX", deadline, tok)
  else
    lost[#lost + 1] = tok
  end
end
return lost
