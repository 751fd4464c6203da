--[[
  Re-run a failed small job in place (Queue.retry, streamq retry): its
  payload goes back into its lane stream as a new entry with no attempt made
  and its dead letter leaves the shard's dead stream (if still there); its
  record is `active` again (its error record and kept payload gone, back in
  `lactive`, out of `ldone`), so it completes once more. The caller names the
  dead-stream entry of its dead letter, which must be the one the job's error
  record names; the payload is the one lane_dead kept beside that record, so a
  dead letter purged or trimmed from the dead stream is retried all the same.
  An error record kept before records named their dead letter has none: then
  the dead-stream entry (found by its job id and time) must be there and name
  the job, and its payload goes back. A lane
  dropped while idle is made again, group and registry entry. The dead letter
  is marked replayed into its own job (the markers `dlq replay` claims), so it
  runs once: a replay that claimed it first refuses this call, and a later
  replay is refused. Idempotent by the token, kept in the record: a call that
  finds the job active under its own token was applied before and its reply
  lost; it changes nothing. The record notes the serial of the dead letter put
  back (`dead`), so the job's next dead letter has the next serial and can be
  retried or replayed in its turn. Refused: a lane member other than the lane the
  record names, and markers other than this dead letter's (KEYS[9] named after
  the letter's job, creation, field and serial, KEYS[10] after its entry id).

  Input:
    KEYS[1] lane     sq:{<shard>}:lane:<prio>:<client>  STREAM (+ consumer group ARGV[1])
    KEYS[2] lanes    sq:{<shard>}:lanes    ZSET "<prio>|<client>" -> priority
    KEYS[3] ljobs    sq:{<shard>}:ljobs    HASH job -> JSON record
    KEYS[4] lerrors  sq:{<shard>}:lerrors  HASH job -> JSON error record
    KEYS[5] lactive  sq:{<shard>}:lactive  ZSET job -> submit ms
    KEYS[6] ldone    sq:{<shard>}:ldone    ZSET job -> forget-after ms
    KEYS[7] dead     sq:{<shard>}:dead     STREAM of dead letters
    KEYS[8] wake     sq:{<shard>}:wake     LIST of wake-up signals
    KEYS[9]  by_letter  sq:{<shard>}:replayed:<job>|<created>|<field>|<serial>  STRING (field 0)
    KEYS[10] by_entry   sq:{<shard>}:replayed-id:<dead entry id>        STRING
    ARGV[1] consumer group name
    ARGV[2] lane member "<prio>|<client>"
    ARGV[3] cap on wake-up signals
    ARGV[4] job id
    ARGV[5] entry id of the job's dead letter in the dead stream
    ARGV[6] retry token
    ARGV[7] lifetime of the replay markers, ms

  Output:
    1 put back now; 2 put back before by this token
    ERR_JOB_NOT_FOUND (-1)     no such small job
    ERR_NOT_FINISHED (-10)     the job has not finished
    ERR_NOTHING_TO_RETRY (-11) the job did not fail, or its dead letter is gone or
                               claimed by a replay
]]
local rcall = redis.call
local laneKey, lanesKey, ljobsKey, lerrorsKey, lactiveKey, ldoneKey, deadKey, wakeKey =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local byLetter, byEntry = KEYS[9], KEYS[10]
local group, member, job, deadId, token = ARGV[1], ARGV[2], ARGV[4], ARGV[5], ARGV[6]

--- @include "includes/errors"
--- @include "includes/int_text"
--- @include "includes/lane_complete"

local raw = rcall("HGET", ljobsKey, job)
if not raw then return ERR_JOB_NOT_FOUND end
local mark = '"retry":"' .. token .. '",'
if lane_active(raw) then
  if string.find(raw, mark, 1, true) then return 2 end
  return ERR_NOT_FINISHED
end
local rest = string.match(raw, '^{"state":"failed","done":%d+,"failed":%d+,"finished":%d+,(.*)$')
if not rest then return ERR_NOTHING_TO_RETRY end
if lane_member_of(raw) ~= member then
  return redis.error_reply("ERR sq_lane_retry refused: ARGV[2] is not the lane the job's record names")
end
-- the dead letter to put back: its payload as lane_dead kept it beside the job's error
-- record (the record names its dead-stream entry, which may since have been purged or
-- trimmed), or, for a dead letter kept before payloads were, its dead-stream entry
local kind, payload, serial, created
local errRaw, kept = unpack(rcall("HMGET", lerrorsKey, job, job .. "|p"))
local okDecode, err = pcall(cjson.decode, errRaw or "")
if kept and okDecode and type(err) == "table" and err.d then
  if err.d ~= deadId then return ERR_NOTHING_TO_RETRY end  -- (another failure's, since)
  kind, payload = string.sub(kept, 1, 1), string.sub(kept, 2)
  serial = int_text(math.floor(tonumber(err.n) or 1))
  created = int_text(lane_field(raw, "created") or 0)
else
  local letter = rcall("XRANGE", deadKey, deadId, deadId)
  if #letter == 0 then return ERR_NOTHING_TO_RETRY end
  local f = {}
  for k = 1, #letter[1][2], 2 do f[letter[1][2][k]] = letter[1][2][k + 1] end
  if f.job ~= job or f.index ~= "0" then return ERR_NOTHING_TO_RETRY end
  kind, payload, serial, created = f.t or "b", f.p or "", f.n or "1", f.c or ""
end
-- the markers are this dead letter's: named after its job, creation, field and serial,
-- and after its entry (the keys' tag is KEYS[1]'s)
local tag = string.match(laneKey, "^(.-}:)")
if byLetter ~= tag .. "replayed:" .. job .. "|" .. created .. "|0|" .. serial
    or byEntry ~= tag .. "replayed-id:" .. deadId then
  return redis.error_reply("ERR sq_lane_retry refused: KEYS[9] and KEYS[10] are not the markers of this dead letter")
end
if rcall("EXISTS", byLetter) == 1 or rcall("EXISTS", byEntry) == 1 then
  return ERR_NOTHING_TO_RETRY  -- a replay claimed it
end

if rcall("EXISTS", laneKey) == 0 then
  rcall("XGROUP", "CREATE", laneKey, group, "0", "MKSTREAM")
  rcall("ZADD", lanesKey, tonumber(string.match(member, "^(%d+)|")), member)
end
rcall("XADD", laneKey, "*", "j", job, "t", kind, "p", payload)
rest = string.gsub(string.gsub(rest, '^"retry":"[^"]*",', '', 1), '^"dead":%d+,', '', 1)
-- the record notes the serial of the dead letter put back: the next is one past it
rcall("HSET", ljobsKey, job, LANE_ACTIVE .. mark .. '"dead":' .. serial .. "," .. rest)
rcall("HDEL", lerrorsKey, job, job .. "|p")
rcall("ZADD", lactiveKey, lane_field(raw, "created") or 0, job)
rcall("ZREM", ldoneKey, job)
rcall("XDEL", deadKey, deadId)
rcall("SET", byLetter, token .. "|" .. job, "PX", ARGV[7])
rcall("SET", byEntry, token .. "|" .. job, "PX", ARGV[7])
if rcall("LLEN", wakeKey) < tonumber(ARGV[3]) then rcall("LPUSH", wakeKey, "1") end
return 1
