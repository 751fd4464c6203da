--[[
  A job owes no more announcements: remove it from the queue's `owed` set,
  where finish_jobs put it because it had dead letters. With a score, only
  if the entry still has that score (a job id reused after its retention,
  finished again meanwhile, is re-added with a newer one and stays).

  Input:
    KEYS[1] owed  sq:{<queue>}:owed  ZSET job -> time it was finished, ms
    ARGV[1] job id
    ARGV[2] the score read with the entry, "" to remove it whatever its score

  Output:
    1 removed, 0 not there (or re-added since)
]]
local rcall = redis.call
local owedKey = KEYS[1]
local job, score = ARGV[1], ARGV[2]

if score ~= "" then
  local current = rcall("ZSCORE", owedKey, job)
  if not current or tonumber(current) ~= tonumber(score) then return 0 end
end
return rcall("ZREM", owedKey, job)
