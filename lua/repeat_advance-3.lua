--[[
  Move a repeat past the tick a ticker submitted: only if that tick is its
  next tick still (compare and set), so of the tickers that read the same due
  tick one advances it, and a repeat paused, removed or replaced meanwhile is
  left as it is. The tick's job was submitted before this call under an id
  made of the tick (idempotent): a ticker that dies in between leaves the tick
  due, and the next ticker's submit of it finds that job and makes no other.

  Input:
    KEYS[1] repeats      sq:{<queue>}:repeats      HASH name -> spec JSON
    KEYS[2] repeat_next  sq:{<queue>}:repeat-next  ZSET name -> next tick ms
    KEYS[3] repeat_last  sq:{<queue>}:repeat-last  ZSET name -> last tick ms
    ARGV[1] repeat name
    ARGV[2] the tick submitted, epoch ms
    ARGV[3] the tick after it, epoch ms (later than it and than Redis's now
            less a minute, at most a year and a day ahead)

  Output:
    1 advanced, 0 the repeat's next tick was not that one
  Errors:
    ERR_TICK_PAST (-13) the next tick is not after the one submitted, or out of range
]]
--- @include "includes/errors"
--- @include "includes/tick_ok"
local rcall = redis.call
local repeatsKey, nextKey, lastKey = KEYS[1], KEYS[2], KEYS[3]
local name, tick, after = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if after <= tick or not tick_ok(after) then return ERR_TICK_PAST end
if rcall("HEXISTS", repeatsKey, name) == 0 then return 0 end
local due = rcall("ZSCORE", nextKey, name)
if not due or tonumber(due) ~= tick then return 0 end
rcall("ZADD", nextKey, after, name)
rcall("ZADD", lastKey, tick, name)
return 1
