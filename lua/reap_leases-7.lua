--[[
  Return expired leases to ready and forget dead workers. A lease is expired
  when its deadline passed or its holder's heartbeat did; a worker is dead
  when its heartbeat deadline passed. A token whose job finished meanwhile
  is dropped instead of returned.

  Deaths and lapses are judged only on time the reapers watched: each call
  notes its time in `reaping`; a call that comes longer than the watched gap
  after the one before finds that Redis (or every reaper) was away meanwhile,
  and no process could beat then. A deadline that fell in such an unwatched
  gap is not taken as a death or a lapse until the grace after the gap has
  run (its worker beats again meanwhile if it is alive); one that passed
  before the gap is, as always. A first call (no `last`: none before it, or
  none for the watch's hour) on a Redis that started less than the grace ago
  finds all time before it unwatched, and takes no death or lapse until the
  grace after it has run; on one up longer, live workers have beaten since.

  Input:
    KEYS[1] workers  sq:{<queue>}:workers  ZSET worker -> heartbeat deadline ms
    KEYS[2] leased   sq:{<queue>}:leased   ZSET token -> lease deadline ms
    KEYS[3] owners   sq:{<queue>}:owners   HASH token -> "<worker id>/<slot>"
    KEYS[4] tokens   sq:{<queue>}:tokens   HASH token -> score
    KEYS[5] ready    sq:{<queue>}:ready    ZSET token -> score
    KEYS[6] wake     sq:{<queue>}:wake     LIST of wake-up signals
    KEYS[7] reaping  sq:{<queue>}:reaping  HASH last (ms of the last call), from and
                                           to (ms: the last unwatched gap)
    ARGV[1] cap on wake-up signals
    ARGV[2] most leases to return in this call
    ARGV[3] watched gap, ms: the longest time between two calls that counts as watched
    ARGV[4] grace, ms: how long after an unwatched gap its deadlines are spared

  Output:
    {returned leases, unwatched ms (the gap's length while its grace runs, else 0),
     dead worker ids...}
]]
local rcall = redis.call
local workersKey, leasedKey, ownersKey, tokensKey, readyKey, wakeKey, reapingKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local cap, limit, watchedGap, grace =
  tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

--- @include "includes/signal_ready"
--- @include "includes/now_ms"

local nowMs = now_ms()

-- the time judged: now, or while an unwatched gap's grace runs, the gap's start
local seen = rcall("HMGET", reapingKey, "last", "from", "to")
local last, from, to = tonumber(seen[1]), tonumber(seen[2]), tonumber(seen[3])
local gapFrom
if not last then
  -- no call before this one (the queue's first, or the reapers were away for the
  -- watch's hour): if Redis started less than the grace ago, a restart may have
  -- lapsed live workers' registrations before any reaper watched, and all time
  -- before now is taken as unwatched
  local up = tonumber(string.match(rcall("INFO", "server"), "uptime_in_seconds:(%d+)"))
  if up and up * 1000 < grace then gapFrom = 0 end
elseif nowMs - last > watchedGap then
  gapFrom = last
end
if gapFrom then
  from, to = gapFrom, nowMs
  rcall("HSET", reapingKey, "from", from, "to", to)
end
rcall("HSET", reapingKey, "last", nowMs)
rcall("PEXPIRE", reapingKey, watchedGap + grace + 3600000)
local judged, unwatched = nowMs, 0
if from and to and nowMs < to + grace then
  judged, unwatched = math.min(nowMs, from), to - from
end

local dead = rcall("ZRANGEBYSCORE", workersKey, "-inf", "(" .. judged, "LIMIT", 0, 1000)
local isDead = {}
for _, w in ipairs(dead) do isDead[w] = true end

local function release(tok)
  rcall("ZREM", leasedKey, tok)
  rcall("HDEL", ownersKey, tok)
  local score = rcall("HGET", tokensKey, tok)
  if score then rcall("ZADD", readyKey, score, tok) end
end

local returned = 0
for _, tok in ipairs(rcall("ZRANGEBYSCORE", leasedKey, "-inf", "(" .. judged, "LIMIT", 0, limit)) do
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

local out = {returned, unwatched}
for _, w in ipairs(dead) do out[#out + 1] = w end
return out
