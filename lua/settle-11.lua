--[[
  Settle the tokens a worker slot holds, then claim new ones, in one round
  trip. Each settled token is released to ready (its job may have more work),
  parked (nothing deliverable now; unless the job was kicked since, in which
  case it goes to ready) or dropped (its job is finished or gone). A token
  whose lease this slot no longer owns is left alone: ownership is per slot
  (owner = "<worker id>/<slot>"), so one slot never settles a token another
  slot of the same worker claimed. Claimed tokens move from ready to leased,
  most urgent first (lowest score), and advance the fairness clock of their
  priority. A slot that claims also takes the jobs whose retries are due
  (from the queue's retries ZSET), for the worker to promote.

  A call may be sent twice (a client that lost the reply resends it): the
  slot numbers its calls, and the reply of its last call is kept in the
  worker's description hash; a call with the number of the last one changes
  nothing and returns that reply again, less the claimed tokens the slot no
  longer owns.

  Input:
    KEYS[1]  ready    sq:{<queue>}:ready        ZSET token -> score
    KEYS[2]  leased   sq:{<queue>}:leased       ZSET token -> lease deadline ms
    KEYS[3]  owners   sq:{<queue>}:owners       HASH token -> "<worker id>/<slot>"
    KEYS[4]  tokens   sq:{<queue>}:tokens       HASH token -> score
    KEYS[5]  parked   sq:{<queue>}:parked       ZSET token -> score
    KEYS[6]  wake     sq:{<queue>}:wake         LIST of wake-up signals
    KEYS[7]  fair     sq:{<queue>}:fair         HASH "<prio>" -> rank last claimed
    KEYS[8]  kick     sq:{<queue>}:kick         HASH token -> 1 when its job got work while leased
    KEYS[9]  retries  sq:{<queue>}:retries      ZSET job id -> due ms of its earliest retry
    KEYS[10] worker   sq:{<queue>}:worker:<id>  HASH describing the worker (holds the last reply)
    KEYS[11] paused   sq:{<queue>}:paused       STRING the pause's id while the queue is paused
    ARGV[1] owner: "<worker id>/<slot>"
    ARGV[2] call number of this slot (a resend carries the number of the call it repeats)
    ARGV[3] lease length, ms
    ARGV[4] number of tokens to claim (0 to only settle)
    ARGV[5] cap on wake-up signals
    ARGV[6] lifetime given to the worker hash when it has none, ms
    ARGV[7] most due jobs to take
    ARGV[8..] pairs (token, mode) with mode "r" release, "p" park, "d" drop

  While the queue is paused the call settles what it is given and claims
  nothing, takes no due job, and notes in the worker hash that this slot saw the
  pause (field "paused:<owner>" = the pause's id): `Queue.pause` waits for that
  note from every live slot, after which no slot starts new work.

  Output:
    {claimed, due, wait, paused}: claimed = flat list {token1, score1, ...}; due
    = ids of jobs whose retries are due (taken out of retries); wait = ms until
    the next retry in retries is due, or -1 when none waits; paused = 1 while
    the queue is paused
]]
local rcall = redis.call
local readyKey, leasedKey, ownersKey, tokensKey, parkedKey, wakeKey, fairKey, kickKey,
      retriesKey, workerKey, pausedKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10],
  KEYS[11]
local owner, seq, leaseMs, want, cap, keepMs, dueLimit =
  ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6],
  tonumber(ARGV[7])
local memoField = "settle:" .. owner

--- @include "includes/now_ms"
--- @include "includes/signal_ready"
--- @include "includes/chunked"

local memo = rcall("HGET", workerKey, memoField)
if memo then
  local sep = string.find(memo, "\n", 1, true)
  if sep and string.sub(memo, 1, sep - 1) == seq then
    -- what the first call claimed, less the tokens this slot lost since (a lease that
    -- ran out, returned and claimed by another slot): never two holders of one token
    local reply = cjson.decode(string.sub(memo, sep + 1))
    local claimed, still = reply[1], {}
    for j = 1, #claimed, 2 do
      if rcall("HGET", ownersKey, claimed[j]) == owner then
        still[#still + 1] = claimed[j]
        still[#still + 1] = claimed[j + 1]
      end
    end
    reply[1] = still
    return reply
  end
end

local nowMs = now_ms()

for j = 8, #ARGV, 2 do
  local tok, mode = ARGV[j], ARGV[j + 1]
  if rcall("HGET", ownersKey, tok) == owner then
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
local due = {}
local wait = -1
local pause = rcall("GET", pausedKey)
if pause then
  want = 0
  rcall("HSET", workerKey, "paused:" .. owner, pause)
end
if want > 0 then
  local popped = rcall("ZPOPMIN", readyKey, want)
  local deadline = tostring(nowMs + leaseMs)  -- formatted once, not once per token
  local leased, owned, topRank, prios = {}, {}, {}, {}
  for j = 1, #popped, 2 do
    local tok = popped[j]
    -- a token is never leased twice: one still held (a reprioritize racing its
    -- holder) is left to the slot that holds it
    if not rcall("ZSCORE", leasedKey, tok) then
      local score = tonumber(popped[j + 1])
      leased[#leased + 1] = deadline
      leased[#leased + 1] = tok
      owned[#owned + 1] = tok
      owned[#owned + 1] = owner
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
  end
  if #leased > 0 then
    chunked("ZADD", leasedKey, leased)
    chunked("HSET", ownersKey, owned)
    for _, prio in ipairs(prios) do
      if topRank[prio] > tonumber(rcall("HGET", fairKey, tostring(prio)) or "0") then
        rcall("HSET", fairKey, tostring(prio), topRank[prio])
      end
    end
  end
  -- due retries: taken here, promoted by the worker in their job's hash slot
  due = rcall("ZRANGEBYSCORE", retriesKey, "-inf", nowMs, "LIMIT", 0, dueLimit)
  if #due > 0 then chunked("ZREM", retriesKey, due) end
  local nextDue = rcall("ZRANGE", retriesKey, 0, 0, "WITHSCORES")
  if #nextDue > 0 then
    wait = tonumber(nextDue[2]) - nowMs
    if wait < 0 then wait = 0 end
  end
end
signal_ready(readyKey, wakeKey, cap)
local reply = {out, due, wait, pause and 1 or 0}
rcall("HSET", workerKey, memoField, seq .. "\n" .. cjson.encode(reply))
if rcall("PTTL", workerKey) < 0 then rcall("PEXPIRE", workerKey, keepMs) end
return reply
