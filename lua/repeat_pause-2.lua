--[[
  Pause or resume a repeat of a queue. A paused repeat keeps its spec and has
  no next tick, so no ticker submits it; resuming gives it the next tick the
  caller computed from Redis's clock (checked as repeat_set checks a first
  tick). Idempotent: pausing a paused repeat, or resuming a running one,
  changes nothing.

  Input:
    KEYS[1] repeats      sq:{<queue>}:repeats      HASH name -> spec JSON
    KEYS[2] repeat_next  sq:{<queue>}:repeat-next  ZSET name -> next tick ms
    ARGV[1] repeat name
    ARGV[2] "pause" or "resume"
    ARGV[3] next tick, epoch ms (resume), or "" (pause)

  Output:
    1 changed, 0 already so
  Errors:
    ERR_NO_REPEAT (-12)  the queue has no repeat of that name
    ERR_TICK_PAST (-13)  a resume's tick is more than a minute past, or over a year ahead
]]
--- @include "includes/errors"
--- @include "includes/tick_ok"
local rcall = redis.call
local repeatsKey, nextKey = KEYS[1], KEYS[2]
local name, mode, tick = ARGV[1], ARGV[2], ARGV[3]
if rcall("HEXISTS", repeatsKey, name) == 0 then return ERR_NO_REPEAT end
local running = rcall("ZSCORE", nextKey, name) ~= false
if mode == "pause" then
  if not running then return 0 end
  rcall("ZREM", nextKey, name)
  return 1
end
if running then return 0 end
if tick == "" then return ERR_TICK_PAST end
tick = tonumber(tick)
if not tick_ok(tick) then return ERR_TICK_PAST end
rcall("ZADD", nextKey, tick, name)
return 1
