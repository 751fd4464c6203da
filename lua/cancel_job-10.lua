--[[
  Cancel a job in its own hash slot: an open or active job becomes terminal with
  state `cancelled` at once. No sub-request of it is delivered afterwards:
  its retries are dropped and the entries no worker has read are deleted,
  so a read of new entries finds nothing (and nothing adds one: adds need
  `open`, and no retry, hand-back or reclaim re-adds an entry of a cancelled
  job). The entries workers hold
  (pending) stay: those running finish, and their acknowledgements still
  store their results (ack keeps them for the job's retention) without
  completing the job again; those not started are dropped by the worker
  (it sees the cancel), by a hand-back or by the reaper (neither re-adds an
  entry of a cancelled job). With nothing pending the stream goes at once;
  otherwise it expires with the job. No add passes afterwards (adds need
  `open`). The job's keys expire after its retention; results stored so far
  stay readable until then.

  Cancelling a job that is terminal already changes nothing. Idempotent by a
  token the caller chooses per call (meta `closer`): a call that finds the job
  cancelled under its own token was applied before and its reply lost; it
  replies completed 1 again, so that the caller still finishes the job
  (finish_jobs records its completion once).

  Input:
    KEYS[1] meta      sq:{<queue>/<job>}:meta            HASH
    KEYS[2] tasks     sq:{<queue>/<job>}:tasks           STREAM
    KEYS[3] results   sq:{<queue>/<job>}:results         HASH
    KEYS[4] errors    sq:{<queue>/<job>}:errors          HASH
    KEYS[5] retry     sq:{<queue>/<job>}:retry           ZSET
    KEYS[6] inflight  sq:{<queue>/<job>}:inflight        HASH
    KEYS[7] added     sq:{<queue>/<job>}:added           HASH deterministic id -> index
    KEYS[8] ids       sq:{<queue>/<job>}:ids             HASH index -> deterministic id
    KEYS[9] dlq       sq:{<queue>/<job>}:dlq             HASH dead-letter payloads
    KEYS[10] unannounced sq:{<queue>/<job>}:unannounced  SET dead letters not yet announced
    ARGV[1] consumer group name
    ARGV[2] closer token, unique per cancel call

  Output:
    {pending, then the job_reply fields {completed (0|1), state, total, ...}}
    `pending` is the number of the job's entries workers still hold; `completed`
    is 1 when this call cancelled the job (or did before, under the same token):
    the caller must then finish it in the queue's hash slot.
    ERR_JOB_NOT_FOUND (-1) no such job
]]
local rcall = redis.call
local metaKey, tasksKey, resultsKey, errorsKey, retryKey, inflightKey, addedKey, idsKey, dlqKey,
      unannouncedKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8],
      KEYS[9], KEYS[10]
local group, closer = ARGV[1], ARGV[2]

--- @include "includes/errors"
--- @include "includes/now_ms"
--- @include "includes/job_reply"

local function pending_count()
  if rcall("EXISTS", tasksKey) == 0 then return 0 end
  local ok, summary = pcall(rcall, "XPENDING", tasksKey, group)
  if not ok then return 0 end
  return tonumber(summary[1]) or 0
end

local function reply(completed)
  local r = job_reply(metaKey, completed)
  table.insert(r, 1, pending_count())
  return r
end

local m = rcall("HMGET", metaKey, "state", "closer")
local state = m[1]
if not state then return ERR_JOB_NOT_FOUND end
if state ~= "open" and state ~= "active" then
  -- terminal: cancelled by this call before (its reply lost), or ended otherwise
  if m[2] == closer then return reply(1) end
  return reply(0)
end

rcall("HSET", metaKey, "state", "cancelled", "finished", now_ms(), "closer", closer)
rcall("DEL", retryKey)
local retentionMs = rcall("HGET", metaKey, "retention")
local pending = pending_count()
if pending == 0 then
  rcall("DEL", tasksKey)
else
  -- the entries after the group's last-delivered id were never read: delete them
  local last = "0-0"
  for _, g in ipairs(rcall("XINFO", "GROUPS", tasksKey)) do
    local f = {}
    for k = 1, #g, 2 do f[g[k]] = g[k + 1] end
    if f["name"] == group then last = f["last-delivered-id"] end
  end
  while true do
    local unread = rcall("XRANGE", tasksKey, "(" .. last, "+", "COUNT", 1000)
    if #unread == 0 then break end
    local ids = {}
    for k = 1, #unread do ids[k] = unread[k][1] end
    rcall("XDEL", tasksKey, unpack(ids))
    last = ids[#ids]
  end
  rcall("PEXPIRE", tasksKey, retentionMs)
end
for _, key in ipairs({metaKey, resultsKey, errorsKey, inflightKey, addedKey, idsKey, dlqKey,
                      unannouncedKey}) do
  rcall("PEXPIRE", key, retentionMs)
end
return reply(1)
