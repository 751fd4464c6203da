--[[
  Record that worker `consumer` starts running a suspect entry (of a job's own
  stream or a small-job lane: its starts hash is the job's `inflight` or the
  shard's `lstarts`), so a kill inside its handler counts an attempt. Only an
  entry still in its stream is recorded: every script that settles an entry
  deletes it and its record in the same call, so a record is never left
  behind. Returns 1 when recorded, 0 when the entry was settled already (the
  caller must not run it).
]]
local function start_record(stream, startsKey, entryId, consumer)
  if #rcall("XRANGE", stream, entryId, entryId) == 0 then return 0 end
  rcall("HSET", startsKey, entryId, consumer)
  return 1
end
