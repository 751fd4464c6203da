--[[
  The job-slot keys of an orphan (a registered job whose meta is gone: it
  was deleted, or it expired before the rest) get a lifetime: whatever has
  none expires after the given retention. A job with meta is left alone.

  Input:
    KEYS[1]  meta         sq:{<job>}:meta         HASH (must be missing)
    KEYS[2]  tasks        sq:{<job>}:tasks        STREAM
    KEYS[3]  results      sq:{<job>}:results      HASH
    KEYS[4]  errors       sq:{<job>}:errors       HASH
    KEYS[5]  retry        sq:{<job>}:retry        ZSET
    KEYS[6]  inflight     sq:{<job>}:inflight     HASH
    KEYS[7]  dlq          sq:{<job>}:dlq          HASH
    KEYS[8]  unannounced  sq:{<job>}:unannounced  SET
    KEYS[9]  added        sq:{<job>}:added        HASH
    KEYS[10] ids          sq:{<job>}:ids          HASH
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
