--[[
  Change a small job's priority (streamq.lane) in its shard's slot: its one
  entry moves from the lane of its priority to the lane of the new one, so
  its next read follows the change, as a job lane job's next claim does.

  - An entry no worker has read yet is copied (all its fields) to the end of
    the new lane and deleted from the old one; the copy keeps when the entry
    was first queued (includes/copy_entry, as a hand-back's copy does), so
    the queue wait a worker measures counts from then.
  - A retry of it waiting in the old lane's retry set moves to the new lane's
    retry set, due when it was, and the shard's `retries` notes the new lane.
  - Either way the new lane is made (stream, group and registry entry) when
    it has no stream: a lane holding work is registered.
  - An entry a worker holds (read, not settled: running, or read to run
    next) stays where it is: nothing changes (reply 2). Its record must keep
    naming the lane its entry is in: a cancel, a status read and a retry
    find the entry there.
  - Otherwise the record's priority becomes the new one (what status shows,
    and the lane a cancel looks in).

  The caller names the lane the job's record names (ARGV[2]); a record that
  names another (changed meanwhile) changes nothing (reply 3: read it again).
  Both lanes are of the record's client. A record that names the new lane
  already (the call sent again after its reply was lost, or a change made
  before) changes nothing (reply 0). The old lane is scanned for the job's
  entry, as lane_cancel does: a lane stream holds its unsettled entries only.

  Input:
    KEYS[1] from       sq:{<shard>}:lane:<prio>:<client>        STREAM
    KEYS[2] fromRetry  sq:{<shard>}:lane:<prio>:<client>:retry  ZSET
            "<attempts>|<job>[,<context>]|<type><payload>" -> due ms
    KEYS[3] to         sq:{<shard>}:lane:<new prio>:<client>        STREAM
    KEYS[4] toRetry    sq:{<shard>}:lane:<new prio>:<client>:retry  ZSET
    KEYS[5] lanes      sq:{<shard>}:lanes    ZSET "<prio>|<client>" -> priority
    KEYS[6] ljobs      sq:{<shard>}:ljobs    HASH job -> JSON record
    KEYS[7] retries    sq:{<shard>}:retries  ZSET "lane|<prio>|<client>" -> due ms
    KEYS[8] wake       sq:{<shard>}:wake     LIST of wake-up signals
    ARGV[1] consumer group name
    ARGV[2] lane member "<prio>|<client>" the record names: KEYS[1], KEYS[2] are its
            lane (the guard checks)
    ARGV[3] lane member "<new prio>|<client>": KEYS[3], KEYS[4] are its lane
    ARGV[4] job id
    ARGV[5] cap on wake-up signals

  Output:
    1 changed; 0 at that priority already; 2 a worker holds its entry (nothing
    changed); 3 its record names another lane than ARGV[2] (nothing changed)
    a refusal (error reply) when ARGV[3] is a lane of another client
    ERR_JOB_NOT_FOUND (-1) no record of the job
    ERR_JOB_FINISHED (-4) the job is terminal (or cancelled)
]]
local rcall = redis.call
local fromKey, fromRetryKey, toKey, toRetryKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local lanesKey, ljobsKey, retriesKey, wakeKey = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local group, from, to, job = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

--- @include "includes/errors"
--- @include "includes/lane_complete"
--- @include "includes/copy_entry"
--- @include "includes/lane_find"

local raw = rcall("HGET", ljobsKey, job)
if not raw then return ERR_JOB_NOT_FOUND end
if not lane_active(raw) then return ERR_JOB_FINISHED end
local prio = lane_digits(raw, "priority")
local newPrio, newClient = string.match(to, "^(%d+)|(.*)$")
if newClient ~= string.match(raw, '"client":"([^"]*)"') then
  return redis.error_reply("ERR sq_lane_reprioritize refused: ARGV[3] is a lane of another client")
end
local named = lane_member_of(raw)
if named == to then return 0 end  -- (a call sent again after its reply was lost)
if named ~= from then return 3 end

-- the job's entry in its lane: held by a worker (pending: running, or read to run
-- next), or read by none
local entries = lane_entries_of(fromKey, job)
for _, e in ipairs(entries) do
  if #rcall("XPENDING", fromKey, group, e[1], e[1], 1) > 0 then return 2 end
end

-- the new lane, made (stream, group, registry entry) when it has no stream
local function ready()
  if rcall("EXISTS", toKey) == 0 then
    rcall("XGROUP", "CREATE", toKey, group, "0", "MKSTREAM")
    rcall("ZADD", lanesKey, tonumber(newPrio), to)
  end
end

for _, e in ipairs(entries) do
  ready()
  copy_entry(toKey, e[1], e[2])
  rcall("XDEL", fromKey, e[1])
end
if #entries > 0 and rcall("LLEN", wakeKey) < tonumber(ARGV[5]) then
  rcall("LPUSH", wakeKey, "1")
end

-- a retry waiting in the old lane's retry set; the new lane is made for it too (a
-- lane whose retry set holds anything is registered: the reaper's lane pass and the
-- backlog walk the registry)
for _, member in ipairs(lane_retries_of(fromRetryKey, job)) do
  ready()
  local due = rcall("ZSCORE", fromRetryKey, member)
  rcall("ZREM", fromRetryKey, member)
  rcall("ZADD", toRetryKey, due, member)
  rcall("ZADD", retriesKey, "LT", due, "lane|" .. to)
end

-- the record's settings are flat and their names never values (lane_complete): the
-- priority is rewritten in place, the rest of the record as it was
local key = '"priority":' .. prio .. ','
local at = string.find(raw, key, 1, true)
rcall("HSET", ljobsKey, job,
      string.sub(raw, 1, at - 1) .. '"priority":' .. newPrio .. ',' ..
      string.sub(raw, at + #key))
return 1
