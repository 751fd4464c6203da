--[[
  The second step of announcing a dead letter (queue's hash slot): copy it to the
  queue's dead-letter stream once. The marker key, named after the job, the
  field and the dead letter's serial, remembers the entry it became: a resent
  call, or a second announcer of the same dead letter, adds nothing and gets
  the same entry id. A marker whose entry holds other contents than this call's
  (a call that named this letter but did not carry it) is not taken for it:
  the letter is added, and the marker then names it.

  Input:
    KEYS[1] dead    sq:{<queue>}:dead                              STREAM
    KEYS[2] marker  sq:{<queue>}:announced:<job>|<created>|<field>|<serial>  STRING entry id,
            with a TTL (<created>: the job's creation ms, which tells a job id reused
            after its retention from the job it had before)
    ARGV[1] cap on the dead stream's length (approximate)
    ARGV[2] lifetime of the marker, ms (the job's retention + 7 days: longer
            than the job-slot record it stands for)
    ARGV[3] job id
    ARGV[4] field (sub-request index, or "entry:<id>")
    ARGV[5] error text
    ARGV[6] attempts
    ARGV[7] time of the dead letter, ms since the epoch
    ARGV[8] type letter
    ARGV[9] payload bytes
    ARGV[10] serial of the dead letter in its job
    ARGV[11] creation time of the job, ms

  Output:
    {1 added now | 0 announced before, id of its entry in the dead stream}
]]
local rcall = redis.call
local deadKey, markerKey = KEYS[1], KEYS[2]

-- the marker names an entry of this letter's contents: copied before. One of other
-- contents (a call that named this letter but did not carry it) does not count: the
-- letter is added and the marker names it. An entry trimmed away is taken as copied
local FIELDS = {job = 3, index = 4, error = 5, attempts = 6, at = 7, t = 8, p = 9, n = 10,
                c = 11}
local function same(fields)
  local seen = 0
  for k = 1, #fields, 2 do
    local at = FIELDS[fields[k]]
    if not at or fields[k + 1] ~= ARGV[at] then return false end
    seen = seen + 1
  end
  return seen == 9
end

local id = rcall("GET", markerKey)
if id then
  local entry = rcall("XRANGE", deadKey, id, id)
  if #entry == 0 or same(entry[1][2]) then return {0, id} end
end
id = rcall("XADD", deadKey, "MAXLEN", "~", ARGV[1], "*", "job", ARGV[3], "index", ARGV[4],
           "error", ARGV[5], "attempts", ARGV[6], "at", ARGV[7], "t", ARGV[8], "p", ARGV[9],
           "n", ARGV[10], "c", ARGV[11])
rcall("SET", markerKey, id, "PX", ARGV[2])
return {1, id}
