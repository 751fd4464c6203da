--[[
  The first step of announcing a job's dead letters (job's hash slot, read side):
  list up to N dead letters of the job not yet copied to the queue's
  dead-letter stream, with their error record and payload. A member whose
  error record is gone (replayed, or expired with the job) has nothing left
  to announce and leaves the set here.

  Input:
    KEYS[1] unannounced  sq:{<queue>/<job>}:unannounced  SET of dlq fields
    KEYS[2] errors       sq:{<queue>/<job>}:errors       HASH field -> JSON {error, attempts, at, n}
    KEYS[3] dlq          sq:{<queue>/<job>}:dlq          HASH field -> type letter + payload
    KEYS[4] meta         sq:{<queue>/<job>}:meta         HASH
    ARGV[1] most dead letters to list

  Output:
    {state ("" when the job is gone), retention ms, created ms (0 when gone: with the
     job id it names the job's incarnation, since an id may be reused after its
     retention), then triples (field, error record JSON, type letter + payload)}
]]
local rcall = redis.call
local unannouncedKey, errorsKey, dlqKey, metaKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local limit = tonumber(ARGV[1])

local m = rcall("HMGET", metaKey, "state", "retention", "created")
local out = {m[1] or "", tonumber(m[2] or "0"), tonumber(m[3] or "0")}
for _, field in ipairs(rcall("SRANDMEMBER", unannouncedKey, limit)) do
  local rec = rcall("HGET", errorsKey, field)
  if rec then
    out[#out + 1] = field
    out[#out + 1] = rec
    out[#out + 1] = rcall("HGET", dlqKey, field) or "b"
  else
    rcall("SREM", unannouncedKey, field)
  end
end
return out
