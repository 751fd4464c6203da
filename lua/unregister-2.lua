--[[
  A stopping worker leaves a queue shard: its entry in the worker registry and
  its description go (what it held was handed back before; a worker that never
  gets here expires with its heartbeat).

  Input:
    KEYS[1] workers  sq:{<queue>}:workers      ZSET worker -> heartbeat deadline ms
    KEYS[2] worker   sq:{<queue>}:worker:<id>  HASH describing the worker
    ARGV[1] worker id

  Output:
    1 when the worker was registered, 0 when it was not
]]
local rcall = redis.call
local workersKey, workerKey = KEYS[1], KEYS[2]
local removed = rcall("ZREM", workersKey, ARGV[1])
rcall("DEL", workerKey)
return removed
