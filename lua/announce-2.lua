--[[
  The second step of announcing a dead letter (queue's hash slot): copy it to the
  queue's dead-letter stream once. The marker key, named after the job, the
  field and the dead letter's serial, remembers the entry it became: a resent
  call, or a second announcer of the same dead letter, adds nothing and gets
  the same entry id.

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

local id = rcall("GET", markerKey)
if id then return {0, id} end
id = rcall("XADD", deadKey, "MAXLEN", "~", ARGV[1], "*", "job", ARGV[3], "index", ARGV[4],
           "error", ARGV[5], "attempts", ARGV[6], "at", ARGV[7], "t", ARGV[8], "p", ARGV[9],
           "n", ARGV[10], "c", ARGV[11])
rcall("SET", markerKey, id, "PX", ARGV[2])
return {1, id}
