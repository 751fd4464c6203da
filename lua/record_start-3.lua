--[[
  Record that a worker starts running a suspect entry (one re-added after its
  worker was lost), so that a kill inside the handler counts an attempt.
  Only an entry still in the stream is recorded: every script that settles
  an entry deletes it (and its record) in the same call, so a delivered entry
  is in the stream exactly while it is pending, and a record written for an
  entry settled meanwhile (reclaimed from a stalled worker) would never be
  removed. The hash lives at most the job's retention + 7 days from its
  last record (config.UNANNOUNCED_GRACE_MS), however the job ends.

  Input:
    KEYS[1] tasks     sq:{<queue>/<job>}:tasks     STREAM
    KEYS[2] inflight  sq:{<queue>/<job>}:inflight  HASH entry id -> consumer
    KEYS[3] meta      sq:{<queue>/<job>}:meta      HASH
    ARGV[1] entry id
    ARGV[2] consumer (worker id)

  Output:
    1 recorded; 0 the entry is settled already (the caller must not run it)
]]
local rcall = redis.call
local tasksKey, inflightKey, metaKey = KEYS[1], KEYS[2], KEYS[3]
local entryId = ARGV[1]

--- @include "includes/start_record"

if start_record(tasksKey, inflightKey, entryId, ARGV[2]) == 0 then return 0 end
rcall("PEXPIRE", inflightKey, tonumber(rcall("HGET", metaKey, "retention") or "0") + 604800000)
return 1
