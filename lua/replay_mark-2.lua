--[[
  Replay a dead letter once: the first caller marks it as replayed by
  itself (a token it chose) and every later caller with another token is
  refused. The same token is accepted again (a resent call, or the caller
  finishing a replay it started), and records where the replay went.
  One dead letter has two marker keys: one named after the job, field and
  serial (shared by every copy of it in the dead stream), one named after
  the dead-stream entry id (a second replay of an entry already deleted).

  Input:
    KEYS[1] by_letter  sq:{<queue>}:replayed:<job>|<created>|<field>|<serial>  STRING "<token>|<target job>"
    KEYS[2] by_entry   sq:{<queue>}:replayed-id:<entry id>           STRING, the same value
    ARGV[1] token of this replay (chosen by the caller, kept across its retries)
    ARGV[2] lifetime of both markers, ms
    ARGV[3] target job id when the replay is done, "" to claim it

  Output:
    {2, ""}      claimed now: replay it
    {1, target}  claimed by this token before (target "" while not done)
    {0, target}  replayed by another caller: refuse
]]
local rcall = redis.call
local byLetter, byEntry = KEYS[1], KEYS[2]
local token, lifeMs, target = ARGV[1], ARGV[2], ARGV[3]

local current = rcall("GET", byLetter) or rcall("GET", byEntry)
if not current then
  rcall("SET", byLetter, token .. "|" .. target, "PX", lifeMs)
  rcall("SET", byEntry, token .. "|" .. target, "PX", lifeMs)
  return {2, target}
end
local bar = string.find(current, "|", 1, true)
local owner, done = string.sub(current, 1, bar - 1), string.sub(current, bar + 1)
if owner ~= token then return {0, done} end
if target ~= "" then
  rcall("SET", byLetter, token .. "|" .. target, "PX", lifeMs)
  rcall("SET", byEntry, token .. "|" .. target, "PX", lifeMs)
  done = target
end
return {1, done}
