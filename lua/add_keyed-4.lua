--[[
  Fenced add for producers that may run twice (Spark tasks retried or run
  speculatively): append sub-requests to an open job, each under a
  deterministic id chosen by the producer. An id already added is skipped,
  so a retried producer adds nothing twice; nothing is added once the job
  is no longer open (finalized or aborted), so a producer still running
  after an abort adds nothing. Each added sub-request raises the job's
  counter of unfinished sub-requests by one and gets the next index.

  Input:
    KEYS[1] meta   sq:{<job>}:meta   HASH
    KEYS[2] tasks  sq:{<job>}:tasks  STREAM
    KEYS[3] added  sq:{<job>}:added  HASH deterministic id -> index
    KEYS[4] ids    sq:{<job>}:ids    HASH index -> deterministic id
    ARGV[1]   lifetime of `added` and `ids` after this call, ms (refreshed by every
              call that adds; aligned with the job's retention when it ends)
    ARGV[2..] triples (deterministic id, type, payload); at most ADD_CHUNK

  Output:
    {added, skipped (ids added before), the job's new total}
    ERR_JOB_NOT_FOUND (-1) no such job
    ERR_JOB_CLOSED (-2)    the job is not open (finalized, aborted or terminal)
]]
local rcall = redis.call
local metaKey, tasksKey, addedKey, idsKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local keepMs = ARGV[1]

--- @include "includes/errors"

local state = rcall("HGET", metaKey, "state")
if not state then return ERR_JOB_NOT_FOUND end
if state ~= "open" then return ERR_JOB_CLOSED end

local total = tonumber(rcall("HGET", metaKey, "total"))
local n, skipped = 0, 0
for j = 2, #ARGV, 3 do
  local id, index = ARGV[j], total + n
  if rcall("HSETNX", addedKey, id, index) == 1 then
    rcall("XADD", tasksKey, "*", "i", index, "t", ARGV[j + 1], "p", ARGV[j + 2])
    rcall("HSET", idsKey, index, id)
    n = n + 1
  else
    skipped = skipped + 1
  end
end
if n > 0 then
  rcall("HINCRBY", metaKey, "remaining", n)
  total = rcall("HINCRBY", metaKey, "total", n)
  rcall("PEXPIRE", addedKey, keepMs)
  rcall("PEXPIRE", idsKey, keepMs)
end
return {n, skipped, total}
