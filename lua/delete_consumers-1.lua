--[[
  Delete consumers of a job's stream that hold nothing, each in the same
  call as the check that it holds nothing. A consumer is deleted only when it
  exists, has no pending entry, and has been idle for at least `min idle`
  (both read from XINFO CONSUMERS here), so an entry read under its name is
  never dropped from the pending list: a read that came before this call
  makes it pending and the consumer is kept; a read that comes after it
  creates the consumer again (XREADGROUP does).

  Input:
    KEYS[1] stream  sq:{<job or shard>}:tasks|lane:<prio>:<client>  STREAM with the consumer
            group: a job's stream or a small-job lane
    ARGV[1] group name
    ARGV[2] min idle, ms: a consumer used more recently than this is kept
    ARGV[3..] candidate consumer names

  Output:
    number of consumers deleted (0 when the stream or the group is gone)
]]
local rcall = redis.call
local tasksKey, group, minIdle = KEYS[1], ARGV[1], tonumber(ARGV[2])

if #ARGV < 3 or rcall("EXISTS", tasksKey) == 0 then return 0 end
local ok, consumers = pcall(rcall, "XINFO", "CONSUMERS", tasksKey, group)
if not ok then return 0 end  -- NOGROUP: nothing to delete

local seen = {}
for _, c in ipairs(consumers) do
  local name, pending, idle
  for i = 1, #c, 2 do
    local f = c[i]
    if f == "name" then name = c[i + 1]
    elseif f == "pending" then pending = c[i + 1]
    elseif f == "idle" then idle = c[i + 1] end
  end
  if name then seen[name] = pending == 0 and idle ~= nil and idle >= minIdle end
end

local deleted = 0
for j = 3, #ARGV do
  if seen[ARGV[j]] then
    rcall("XGROUP", "DELCONSUMER", tasksKey, group, ARGV[j])
    seen[ARGV[j]] = false
    deleted = deleted + 1
  end
end
return deleted
