--[[
  Drop an idle lane (streamq.lane): a lane stream with no entry (none waiting,
  none pending: pending entries stay in the stream until settled) and no
  retry waiting is deleted with its group and leaves the shard's registry, so
  workers stop reading it and its memory goes. Checked and done in one call:
  a submit, retry or reclaim that comes after it creates the lane again.

  Input:
    KEYS[1] lane   sq:{<shard>}:lane:<prio>:<client>        STREAM
    KEYS[2] retry  sq:{<shard>}:lane:<prio>:<client>:retry  ZSET
    KEYS[3] lanes  sq:{<shard>}:lanes  ZSET "<prio>|<client>" -> priority
    ARGV[1] consumer group name
    ARGV[2] lane member "<prio>|<client>"

  Output:
    1 dropped, 0 kept (it has work)
]]
local rcall = redis.call
local laneKey, retryKey, lanesKey = KEYS[1], KEYS[2], KEYS[3]

if rcall("ZCARD", retryKey) > 0 then return 0 end
if rcall("EXISTS", laneKey) == 1 then
  if rcall("XLEN", laneKey) > 0 then return 0 end
  local ok, summary = pcall(rcall, "XPENDING", laneKey, ARGV[1])
  if ok and tonumber(summary[1]) > 0 then return 0 end
  rcall("DEL", laneKey)
end
rcall("ZREM", lanesKey, ARGV[2])
return 1
