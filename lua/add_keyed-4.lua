--[[
  Fenced add for producers that may run twice (Spark tasks retried or run
  speculatively): append sub-requests to an open job, each under an id the
  producer derives from the row itself (a key column, or the row's content),
  so that it is the same on every attempt whatever order the rows come in.
  Only the write that opened the job adds to it (its write token is the
  job's incarnation), and nothing is added once the job is no longer open
  (committed, aborted or terminal), so a task still running after its write
  ended adds nothing.

  Each id is stored with the digest of its payload and the partition that
  added it. An id added before is skipped when both match (a retried or
  speculative task, or this call sent again after a lost reply). When the
  digest differs, the row changed between attempts; when the partition
  differs, two partitions produced the same id (a key column that is not
  unique, or rows that moved between partitions): the call fails and adds
  nothing, since the producer cannot prove the row was added once.
  Each added sub-request raises the job's counter of unfinished
  sub-requests by one and gets the next index.

  Input:
    KEYS[1] meta   sq:{<queue>/<job>}:meta   HASH
    KEYS[2] tasks  sq:{<queue>/<job>}:tasks  STREAM
    KEYS[3] added  sq:{<queue>/<job>}:added  HASH id -> "<index>|<digest>|<partition>|<attempt>"
    KEYS[4] ids    sq:{<queue>/<job>}:ids    HASH index -> id
    ARGV[1]   lifetime of `added` and `ids` after this call, ms (refreshed by every
              call that adds; aligned with the job's retention when it ends)
    ARGV[2]   write token: must be the job's incarnation
    ARGV[3]   partition of the producing task
    ARGV[4]   attempt of the producing task (stored, for diagnosis only)
    ARGV[5..] quads (id, digest, type, payload); at most ADD_CHUNK; ids distinct

  Output:
    {added, skipped (ids added before), the job's new total}
    ERR_JOB_NOT_FOUND (-1)  no such job
    ERR_JOB_CLOSED (-2)     the job is not open (committed, aborted or terminal)
    ERR_NOT_WRITER (-6)     the job was opened by another write
    {ERR_ROW_CHANGED (-7), id, partition that added it}    nothing added
    {ERR_DUPLICATE_ID (-8), id, partition that added it}   nothing added
]]
local rcall = redis.call
local metaKey, tasksKey, addedKey, idsKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local keepMs, token, partition, attempt = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

--- @include "includes/errors"

local m = rcall("HMGET", metaKey, "state", "incarnation", "total")
if not m[1] then return ERR_JOB_NOT_FOUND end
if m[2] ~= token then return ERR_NOT_WRITER end
if m[1] ~= "open" then return ERR_JOB_CLOSED end

-- check every id first: a call that fails adds nothing
local ids = {}
for j = 5, #ARGV, 4 do ids[#ids + 1] = ARGV[j] end
if #ids == 0 then return {0, 0, tonumber(m[3])} end
local found = rcall("HMGET", addedKey, unpack(ids))
local skipped = 0
for k = 1, #ids do
  local v = found[k]
  if v then
    local _, digest, owner = string.match(v, "^([^|]*)|([^|]*)|([^|]*)")
    if owner ~= partition then return {ERR_DUPLICATE_ID, ids[k], owner} end
    if digest ~= ARGV[4 * k + 2] then return {ERR_ROW_CHANGED, ids[k], owner} end
    skipped = skipped + 1
  end
end

local total = tonumber(m[3])
local n = 0
if skipped < #ids then
  local addedArgs, idsArgs = {}, {}
  for k = 1, #ids do
    if not found[k] then
      local j = 4 * k + 1
      local index = total + n
      rcall("XADD", tasksKey, "*", "i", index, "t", ARGV[j + 2], "p", ARGV[j + 3])
      addedArgs[#addedArgs + 1] = ids[k]
      addedArgs[#addedArgs + 1] = index .. "|" .. ARGV[j + 1] .. "|" .. partition .. "|" .. attempt
      idsArgs[#idsArgs + 1] = index
      idsArgs[#idsArgs + 1] = ids[k]
      n = n + 1
    end
  end
  rcall("HSET", addedKey, unpack(addedArgs))
  rcall("HSET", idsKey, unpack(idsArgs))
  rcall("HINCRBY", metaKey, "remaining", n)
  total = rcall("HINCRBY", metaKey, "total", n)
  rcall("PEXPIRE", addedKey, keepMs)
  rcall("PEXPIRE", idsKey, keepMs)
end
return {n, skipped, total}
