--[[
  Settle the tokens a worker holds, then claim new ones, in one round trip.
  Each settled token is released to ready (its job may have more work),
  parked (nothing deliverable now; unless the job was kicked since, in which
  case it goes to ready) or dropped (its job is finished or gone). A token
  whose lease this worker no longer owns is left alone. Claimed tokens move
  from ready to leased, most urgent first (lowest score), and advance the
  fairness clock of their priority.

  Input:
    KEYS[1] ready   sq:{<queue>}:ready   ZSET token -> score
    KEYS[2] leased  sq:{<queue>}:leased  ZSET token -> lease deadline ms
    KEYS[3] owners  sq:{<queue>}:owners  HASH token -> worker id
    KEYS[4] tokens  sq:{<queue>}:tokens  HASH token -> score
    KEYS[5] parked  sq:{<queue>}:parked  ZSET token -> score
    KEYS[6] wake    sq:{<queue>}:wake    LIST of wake-up signals
    KEYS[7] fair    sq:{<queue>}:fair    HASH "<prio>" -> rank last claimed
    KEYS[8] kick    sq:{<queue>}:kick    HASH token -> 1 when its job got work while leased
    ARGV[1] worker id
    ARGV[2] lease length, ms (a claimed token's deadline is Redis's clock + this)
    ARGV[3] number of tokens to claim (0 to only settle)
    ARGV[4] cap on wake-up signals
    ARGV[5..] pairs (token, mode) with mode "r" release, "p" park, "d" drop

  Output:
    flat list of claimed tokens and their scores: {token1, score1, token2, score2, ...}
]]
local rcall = redis.call
local readyKey, leasedKey, ownersKey, tokensKey, parkedKey, wakeKey, fairKey, kickKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local worker, leaseMs, want, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

--- @include "includes/signal_ready"
--- @include "includes/chunked"
--- @include "includes/now_ms"

for j = 5, #ARGV, 2 do
  local tok, mode = ARGV[j], ARGV[j + 1]
  if rcall("HGET", ownersKey, tok) == worker then
    rcall("HDEL", ownersKey, tok)
    rcall("ZREM", leasedKey, tok)
    local kicked = rcall("HDEL", kickKey, tok) == 1
    local score = rcall("HGET", tokensKey, tok)
    if mode == "d" or not score then
      rcall("HDEL", tokensKey, tok)
    elseif mode == "p" and not kicked then
      rcall("ZADD", parkedKey, score, tok)
    else
      rcall("ZADD", readyKey, score, tok)
    end
  end
end

-- claim: one ZADD and one HSET for all claimed tokens; the fairness clock of
-- each priority advances to the highest rank claimed in it
local out = {}
if want > 0 then
  local popped = rcall("ZPOPMIN", readyKey, want)
  local deadline = tostring(now_ms() + leaseMs)  -- formatted once, not once per token
  local leased, owners, topRank, prios = {}, {}, {}, {}
  for j = 1, #popped, 2 do
    local tok, score = popped[j], tonumber(popped[j + 1])
    leased[#leased + 1] = deadline
    leased[#leased + 1] = tok
    owners[#owners + 1] = tok
    owners[#owners + 1] = worker
    local prio = math.floor(score / 1e12)
    local rank = score - prio * 1e12
    if topRank[prio] == nil then
      prios[#prios + 1] = prio
      topRank[prio] = rank
    elseif rank > topRank[prio] then
      topRank[prio] = rank
    end
    out[#out + 1] = tok
    out[#out + 1] = popped[j + 1]
  end
  if #popped > 0 then
    chunked("ZADD", leasedKey, leased)
    chunked("HSET", ownersKey, owners)
    for _, prio in ipairs(prios) do
      if topRank[prio] > tonumber(rcall("HGET", fairKey, tostring(prio)) or "0") then
        rcall("HSET", fairKey, tostring(prio), topRank[prio])
      end
    end
  end
end
signal_ready(readyKey, wakeKey, cap)
return out
