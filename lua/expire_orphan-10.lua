--[[
  The job-slot keys of an orphan (a registered job whose meta is gone: it
  was deleted, or it expired before the rest) get a lifetime: whatever has
  none expires after the given retention. A job with meta is left alone.

  Input:
    KEYS[1]  meta         sq:{<queue>/<job>}:meta         HASH (must be missing)
    KEYS[2]  tasks        sq:{<queue>/<job>}:tasks        STREAM
    KEYS[3]  results      sq:{<queue>/<job>}:results      HASH
    KEYS[4]  errors       sq:{<queue>/<job>}:errors       HASH
    KEYS[5]  retry        sq:{<queue>/<job>}:retry        ZSET
    KEYS[6]  inflight     sq:{<queue>/<job>}:inflight     HASH
    KEYS[7]  dlq          sq:{<queue>/<job>}:dlq          HASH
    KEYS[8]  unannounced  sq:{<queue>/<job>}:unannounced  SET
    KEYS[9]  added        sq:{<queue>/<job>}:added        HASH
    KEYS[10] ids          sq:{<queue>/<job>}:ids          HASH
    ARGV[1] retention, ms

  Output:
    the number of keys given a lifetime; -1 when the job has meta
]]
local rcall = redis.call

if rcall("EXISTS", KEYS[1]) == 1 then return -1 end
local n = 0
for k = 2, #KEYS do
  if rcall("PTTL", KEYS[k]) == -1 then
    rcall("PEXPIRE", KEYS[k], ARGV[1])
    n = n + 1
  end
end
return n
