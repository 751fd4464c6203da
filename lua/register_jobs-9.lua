--[[
  Register jobs in their queue and give each its tokens. A scheduled job (due
  > 0) gets its tokens parked and its due time in `retries`: live workers take
  it from there at that time and promote its sub-requests, as they promote
  retries, which makes its tokens ready. A token's score is
  priority * 1e12 + rank, where the rank implements fairness inside one
  priority: each client's jobs get consecutive ranks, starting no earlier
  than the rank last claimed, so clients take turns. Idempotent: a job
  already registered, or already finished, is left alone.

  "Already finished" compares no clocks: `finished` holds one member per
  finished job incarnation ("<job>|<incarnation>", see finish_jobs), so a job
  is refused exactly when this incarnation of it was finished. A job id
  reused after its records expired is a new incarnation and registers; the
  old incarnation's member is not looked at and expires on its own.

  Input:
    KEYS[1] active    sq:{<queue>}:active    ZSET job -> registration ms (Redis's clock)
    KEYS[2] finished  sq:{<queue>}:finished  ZSET "<job>|<incarnation>" -> forget-after ms
    KEYS[3] tokens    sq:{<queue>}:tokens    HASH token -> score
    KEYS[4] ready     sq:{<queue>}:ready     ZSET token -> score
    KEYS[5] fair      sq:{<queue>}:fair      HASH "<prio>:<client>" -> last rank, "<prio>" -> rank last claimed
    KEYS[6] wake      sq:{<queue>}:wake      LIST of wake-up signals
    KEYS[7] creating  sq:{<queue>}:creating  ZSET intent -> time written, ms
    KEYS[8] parked    sq:{<queue>}:parked    ZSET token -> score
    KEYS[9] retries   sq:{<queue>}:retries   ZSET job id -> due ms of its earliest retry
    ARGV[1] cap on wake-up signals
    ARGV[2..] septuples (job id, priority, client, concurrency, incarnation, dedup key
              or "", due ms or 0)

  Output:
    one code per job: 0 finished already, 1 registered already, 2 registered now
]]
local rcall = redis.call
local activeKey, finishedKey, tokensKey, readyKey, fairKey, wakeKey, creatingKey, parkedKey,
      retriesKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8],
      KEYS[9]
local cap = tonumber(ARGV[1])

--- @include "includes/signal_ready"
--- @include "includes/chunked"
--- @include "includes/now_ms"

local nowMs = now_ms()

-- fairness ranks are read once per client and priority and written back once;
-- all tokens go in with one HSET and one ZADD (in slices of 500) at the end
local out, lastRank, served, touched, tokenScores, readyPairs = {}, {}, {}, {}, {}, {}
local parkedPairs, duePairs = {}, {}
local intents = {}
for j = 2, #ARGV, 7 do
  local job, prio, client, conc = ARGV[j], tonumber(ARGV[j + 1]), ARGV[j + 2], tonumber(ARGV[j + 3])
  if ARGV[j + 5] == "" then
    intents[#intents + 1] = job
  else
    intents[#intents + 1] = job .. "|" .. ARGV[j + 5]
  end
  if rcall("ZSCORE", finishedKey, job .. "|" .. ARGV[j + 4]) then
    out[#out + 1] = 0
  elseif rcall("ZADD", activeKey, "NX", nowMs, job) == 0 then
    out[#out + 1] = 1
  else
    local clientField = prio .. ":" .. client
    if lastRank[clientField] == nil then
      lastRank[clientField] = tonumber(rcall("HGET", fairKey, clientField) or "0")
      touched[#touched + 1] = clientField
    end
    if served[prio] == nil then
      served[prio] = tonumber(rcall("HGET", fairKey, tostring(prio)) or "0")
    end
    local rank = lastRank[clientField] + 1
    if rank < served[prio] then rank = served[prio] end
    lastRank[clientField] = rank
    local score = tostring(prio * 1e12 + rank)  -- formatted once for all its tokens
    local due = tonumber(ARGV[j + 6])
    local into = readyPairs
    if due > 0 then
      into = parkedPairs
      duePairs[#duePairs + 1] = due
      duePairs[#duePairs + 1] = job
    end
    for i = 0, conc - 1 do
      local tok = job .. "#" .. i
      tokenScores[#tokenScores + 1] = tok
      tokenScores[#tokenScores + 1] = score
      into[#into + 1] = score
      into[#into + 1] = tok
    end
    out[#out + 1] = 2
  end
end
if #touched > 0 then
  local fields = {}
  for _, f in ipairs(touched) do
    fields[#fields + 1] = f
    fields[#fields + 1] = lastRank[f]
  end
  chunked("HSET", fairKey, fields)
  chunked("HSET", tokensKey, tokenScores)
  chunked("ZADD", readyKey, readyPairs)
  chunked("ZADD", parkedKey, parkedPairs)
end
for k = 1, #duePairs, 2 do  -- the earliest due time of a job is kept (as retries do)
  rcall("ZADD", retriesKey, "LT", duePairs[k], duePairs[k + 1])
end
-- an idle worker sleeps until the earliest due time it knows of: wake one, so it
-- learns of this one (its settle says how long to wait)
if #duePairs > 0 and rcall("LLEN", wakeKey) == 0 then rcall("LPUSH", wakeKey, "1") end
chunked("ZREM", creatingKey, intents)
signal_ready(readyKey, wakeKey, cap)
return out
