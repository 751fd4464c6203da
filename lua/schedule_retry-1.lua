--[[
  Second step of a retry, in the queue's hash slot: note that a job has a retry
  due after `delay` ms, so live workers promote it (they take due jobs in
  `settle`). Keeps the earliest due time of a job; idempotent (a resend, or
  a job already noted earlier, changes nothing). The retry itself lives in
  the job's hash slot (`fail` put it there); the reaper promotes it on its pass
  when this step never ran (the worker died in between).

  Input:
    KEYS[1] retries  sq:{<queue>}:retries  ZSET job id -> due ms of its earliest retry
    ARGV[1] job id
    ARGV[2] delay until the retry is due, ms

  Output:
    1 when the job's due time was added or moved earlier, else 0
]]
local rcall = redis.call
local retriesKey = KEYS[1]

--- @include "includes/now_ms"

return rcall("ZADD", retriesKey, "LT", "CH", now_ms() + tonumber(ARGV[2]), ARGV[1])
