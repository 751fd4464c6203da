--[[
  Record that a worker starts running a suspect small-job entry (one re-added
  after its worker was lost, or a retry), so that a kill inside the handler
  counts an attempt. Only an entry still in the stream is recorded: every
  script that settles a lane entry deletes it and its record in the same
  call, so a record is never left behind.

  Input:
    KEYS[1] lane     sq:{<shard>}:lane:<prio>:<client>  STREAM
    KEYS[2] lstarts  sq:{<shard>}:lstarts  HASH entry id -> consumer
    ARGV[1] entry id
    ARGV[2] consumer (worker id)

  Output:
    1 recorded; 0 the entry is settled already (the caller must not run it)
]]
local rcall = redis.call
local laneKey, startsKey = KEYS[1], KEYS[2]

--- @include "includes/start_record"

return start_record(laneKey, startsKey, ARGV[1], ARGV[2])
