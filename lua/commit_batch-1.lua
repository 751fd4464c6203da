--[[
  Commit one micro-batch of a streaming query into its one long-running job
  (the streaming sink's single-job mode): the job stays open, and records the
  last committed batch and the total it reached. Only the query's write token
  (the job's incarnation) commits. The job must hold exactly the sub-requests
  of the batches committed before plus the ones this batch's tasks produced,
  else nothing changes. A batch committed before (the query died after this
  commit and before Spark recorded it, or this call resent) changes nothing.

  Input:
    KEYS[1] meta  sq:{<queue>/<job>}:meta  HASH (fields stream_batch, stream_total)
    ARGV[1] write token
    ARGV[2] batch id (integer, rising)
    ARGV[3] sub-requests the batch's successful tasks produced

  Output:
    1 committed now; 0 committed before
    ERR_JOB_NOT_FOUND (-1)  no such job
    ERR_JOB_CLOSED (-2)     the job is not open
    ERR_NOT_WRITER (-6)     the job was opened by another query or write
    {ERR_TOTAL_MISMATCH (-3), the job's total, the total expected}  nothing changed
]]
local rcall = redis.call
local metaKey = KEYS[1]
local token, batch, produced = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

--- @include "includes/errors"

local m = rcall("HMGET", metaKey, "state", "incarnation", "total", "stream_batch", "stream_total")
if not m[1] then return ERR_JOB_NOT_FOUND end
if m[2] ~= token then return ERR_NOT_WRITER end
local last = tonumber(m[4] or "-1")
if batch <= last then return 0 end
if m[1] ~= "open" then return ERR_JOB_CLOSED end
local expected = tonumber(m[5] or "0") + produced
if tonumber(m[3]) ~= expected then return {ERR_TOTAL_MISMATCH, tonumber(m[3]), expected} end
rcall("HSET", metaKey, "stream_batch", batch, "stream_total", expected)
return 1
