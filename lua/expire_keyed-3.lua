--[[
  Align the lifetime of a job's deterministic-id maps with the job's own:
  once the job is terminal (its meta expires after the retention), the maps
  get the same remaining lifetime. A job still open or active is left alone
  (its maps keep the lifetime the last fenced add gave them).

  Input:
    KEYS[1] meta   sq:{<queue>/<job>}:meta   HASH
    KEYS[2] added  sq:{<queue>/<job>}:added  HASH deterministic id -> index
    KEYS[3] ids    sq:{<queue>/<job>}:ids    HASH index -> deterministic id
    (no ARGV)

  Output:
    the remaining lifetime given, ms; 0 when nothing changed (job live, or
    meta without expiry)
    ERR_JOB_NOT_FOUND (-1) no such job
]]
local rcall = redis.call
local metaKey, addedKey, idsKey = KEYS[1], KEYS[2], KEYS[3]

--- @include "includes/errors"

local state = rcall("HGET", metaKey, "state")
if not state then return ERR_JOB_NOT_FOUND end
if state == "open" or state == "active" then return 0 end
local ttl = rcall("PTTL", metaKey)
if ttl <= 0 then return 0 end
rcall("PEXPIRE", addedKey, ttl)
rcall("PEXPIRE", idsKey, ttl)
return ttl
