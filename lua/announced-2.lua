--[[
  The last step of announcing dead letters (job's hash slot): the ones now in the
  queue's dead-letter stream leave `unannounced`. A field is removed only if
  its error record is the dead letter that was announced (same serial) or is
  gone: a sub-request replayed and dead-lettered again meanwhile is a newer
  dead letter that still waits for its announcement.

  Input:
    KEYS[1] unannounced  sq:{<queue>/<job>}:unannounced  SET of dlq fields
    KEYS[2] errors       sq:{<queue>/<job>}:errors       HASH field -> JSON {error, attempts, at, n}
    ARGV[1..] pairs (field, serial announced)

  Output:
    the number of dead letters still waiting for their announcement
]]
local rcall = redis.call
local unannouncedKey, errorsKey = KEYS[1], KEYS[2]

for j = 1, #ARGV, 2 do
  local rec = rcall("HGET", errorsKey, ARGV[j])
  local serial = rec and tostring(cjson.decode(rec).n or 0)
  if not rec or serial == ARGV[j + 1] then
    rcall("SREM", unannouncedKey, ARGV[j])
  end
end
return rcall("SCARD", unannouncedKey)
