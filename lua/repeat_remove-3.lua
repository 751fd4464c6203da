--[[
  Remove a repeat of a queue: its spec, its next tick, its last tick. The jobs
  its ticks submitted stay. A tick a ticker read before the remove finds no
  next tick to advance (repeat_advance), so nothing runs it again.

  Input:
    KEYS[1] repeats      sq:{<queue>}:repeats      HASH name -> spec JSON
    KEYS[2] repeat_next  sq:{<queue>}:repeat-next  ZSET name -> next tick ms
    KEYS[3] repeat_last  sq:{<queue>}:repeat-last  ZSET name -> last tick ms
    ARGV[1] repeat name

  Output:
    1 removed, 0 there was none
]]
local rcall = redis.call
local name = ARGV[1]
rcall("ZREM", KEYS[2], name)
rcall("ZREM", KEYS[3], name)
return rcall("HDEL", KEYS[1], name)
