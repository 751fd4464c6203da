--[[
  Change a registered job's priority and/or concurrency in its queue's hash slot
  (the first step of Queue.reprioritize; the job's meta follows in its own
  slot). A job's tokens are "<job>#0" .. "#<n-1>", contiguous. Each keeps its
  fairness rank; a new priority re-scores it where it waits (ready, parked) and
  in `tokens` (a leased token is re-scored when it is released: settle reads
  `tokens`). Tokens beyond a lower concurrency are removed where they wait; a
  leased one loses its score, so the settle that releases it drops it. Tokens
  added for a higher concurrency go to ready, but one still leased (taken away by
  a lower concurrency while it ran) only gets its score back: its release makes
  it ready. Idempotent: a resend finds the
  tokens already so.

  Input:
    KEYS[1] tokens  sq:{<queue>}:tokens  HASH token -> score
    KEYS[2] ready   sq:{<queue>}:ready   ZSET token -> score
    KEYS[3] parked  sq:{<queue>}:parked  ZSET token -> score
    KEYS[4] leased  sq:{<queue>}:leased  ZSET token -> lease deadline ms
    KEYS[5] kick    sq:{<queue>}:kick    HASH token -> 1
    KEYS[6] wake    sq:{<queue>}:wake    LIST of wake-up signals
    KEYS[7] active  sq:{<queue>}:active  ZSET job -> registration ms
    ARGV[1] job id
    ARGV[2] new priority, "" to keep
    ARGV[3] new concurrency, "" to keep
    ARGV[4] cap on wake-up signals

  Output:
    the job's concurrency before this call (its tokens); 0 when the job has no
    token (not registered in this shard, or finished)
]]
local rcall = redis.call
local tokensKey, readyKey, parkedKey, leasedKey, kickKey, wakeKey, activeKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local job = ARGV[1]

--- @include "includes/signal_ready"

if not rcall("ZSCORE", activeKey, job) then return 0 end
local scores = {}
local n = 0
while true do
  local score = rcall("HGET", tokensKey, job .. "#" .. n)
  if not score then break end
  n = n + 1
  scores[n] = tonumber(score)
end
if n == 0 then return 0 end
local prio0 = math.floor(scores[1] / 1e12)
local rank = scores[1] - prio0 * 1e12
local prio = prio0
if ARGV[2] ~= "" then prio = tonumber(ARGV[2]) end
local want = n
if ARGV[3] ~= "" then want = tonumber(ARGV[3]) end

for i = 0, n - 1 do
  local tok = job .. "#" .. i
  if i >= want then
    rcall("HDEL", tokensKey, tok)
    rcall("ZREM", readyKey, tok)
    rcall("ZREM", parkedKey, tok)
    rcall("HDEL", kickKey, tok)
  else
    local old = scores[i + 1]
    local score = prio * 1e12 + (old - math.floor(old / 1e12) * 1e12)
    if score ~= old then
      rcall("HSET", tokensKey, tok, score)
      if rcall("ZSCORE", readyKey, tok) then
        rcall("ZADD", readyKey, score, tok)
      elseif rcall("ZSCORE", parkedKey, tok) then
        rcall("ZADD", parkedKey, score, tok)
      end
    end
  end
end
for i = n, want - 1 do
  local tok = job .. "#" .. i
  local score = prio * 1e12 + rank
  rcall("HSET", tokensKey, tok, score)
  -- a token a lower concurrency took away may still be leased by the slot running
  -- it: it gets its score back (the settle that releases it returns it to ready),
  -- but it is not made ready now, or a second slot would run it at the same time
  if not rcall("ZSCORE", leasedKey, tok) then
    rcall("ZADD", readyKey, score, tok)
  end
end
signal_ready(readyKey, wakeKey, tonumber(ARGV[4]))
return n
