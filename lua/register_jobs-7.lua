--[[
  Register jobs in their queue and give each its tokens. A token's score is
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
    ARGV[1] cap on wake-up signals
    ARGV[2..] sextuples (job id, priority, client, concurrency, incarnation, dedup key
              or "")

  Output:
    one code per job: 0 finished already, 1 registered already, 2 registered now
]]
local rcall = redis.call
local activeKey, finishedKey, tokensKey, readyKey, fairKey, wakeKey, creatingKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local cap = tonumber(ARGV[1])

--- @include "includes/signal_ready"
--- @include "includes/chunked"
--- @include "includes/now_ms"

local nowMs = now_ms()

-- fairness ranks are read once per client and priority and written back once;
-- all tokens go in with one HSET and one ZADD (in slices of 500) at the end
local out, lastRank, served, touched, tokenScores, readyPairs = {}, {}, {}, {}, {}, {}
local intents = {}
for j = 2, #ARGV, 6 do
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
    for i = 0, conc - 1 do
      local tok = job .. "#" .. i
      tokenScores[#tokenScores + 1] = tok
      tokenScores[#tokenScores + 1] = score
      readyPairs[#readyPairs + 1] = score
      readyPairs[#readyPairs + 1] = tok
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
end
chunked("ZREM", creatingKey, intents)
signal_ready(readyKey, wakeKey, cap)
return out
