--[[
  Add or replace a repeat of a queue (Queue.repeats.add, streamq repeat add):
  its spec, and its next tick, which makes it run (a paused repeat runs again).
  The time of a repeat's last tick is kept across a replace. The first tick is
  the caller's (computed from the spec and Redis's clock read just before) and
  is checked against this script's clock: at most a minute before now, at most
  a year and a day after.

  Input:
    KEYS[1] repeats      sq:{<queue>}:repeats      HASH name -> spec JSON
    KEYS[2] repeat_next  sq:{<queue>}:repeat-next  ZSET name -> next tick ms
    KEYS[3] repeat_last  sq:{<queue>}:repeat-last  ZSET name -> last tick ms
    ARGV[1] repeat name
    ARGV[2] spec JSON
    ARGV[3] first tick, epoch ms

  Output:
    1 added, 0 replaced
  Errors:
    ERR_TICK_PAST (-13) the first tick is more than a minute past, or over a year ahead
]]
--- @include "includes/errors"
--- @include "includes/tick_ok"
local rcall = redis.call
local repeatsKey, nextKey = KEYS[1], KEYS[2]
local name, spec, first = ARGV[1], ARGV[2], tonumber(ARGV[3])
if not tick_ok(first) then return ERR_TICK_PAST end
local added = rcall("HSET", repeatsKey, name, spec)
rcall("ZADD", nextKey, first, name)
return added
