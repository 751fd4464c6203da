--[[
  Drop the intent of a job whose create never ran (the reaper found no meta
  for it after the grace period), and release the dedup key it reserved when
  that key still names this job and is still reserved (forget-after +inf:
  no finish ever set its time). A key that names another job, or that a
  finish already gave a forget-after time, is left alone. Idempotent.

  Input:
    KEYS[1] creating  sq:{<queue>}:creating  ZSET intent -> time written, ms
    KEYS[2] dedup     sq:{<queue>}:dedup     HASH dedup key -> job id
    KEYS[3] dedupx    sq:{<queue>}:dedupx    ZSET dedup key -> forget-after ms
    ARGV[1] job id
    ARGV[2] dedup key, "" for none (the intent is then the job id, else
            "<job>|<dedup key>")
    ARGV[3] the intent's time as the caller read it, ms: the intent is dropped
            only while it still has that time (one a producer refreshed since,
            see reserve_dedup, is kept)

  Output:
    {1 when the intent was dropped else 0, 1 when the dedup key was released else 0}
]]
local rcall = redis.call
local creatingKey, dedupKey, dedupxKey = KEYS[1], KEYS[2], KEYS[3]
local job, dedup = ARGV[1], ARGV[2]

local member = job
if dedup ~= "" then member = job .. "|" .. dedup end
local score = rcall("ZSCORE", creatingKey, member)
if not score or tonumber(score) ~= tonumber(ARGV[3]) then return {0, 0} end
rcall("ZREM", creatingKey, member)
local released = 0
if dedup ~= "" and rcall("HGET", dedupKey, dedup) == job then
  local forget = rcall("ZSCORE", dedupxKey, dedup)
  if forget == "inf" or forget == "+inf" then
    rcall("HDEL", dedupKey, dedup)
    rcall("ZREM", dedupxKey, dedup)
    released = 1
  end
end
return {1, released}
