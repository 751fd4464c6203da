--[[
  streamq's guard: the helpers of the check every function of the library runs
  before its own. Each function's check is written out from its declared contract
  (streamq/storage/contracts.py) by streamq/storage/guard_lua.py, as straight-line
  Lua: SQ_GUARDS.<script>(KEYS, ARGV). It checks that
    - there are exactly as many KEYS as declared;
    - every KEYS[i] is sq:{<tag>}:<kind_i> (plus the suffix its kind declares),
      with one tag for the whole call, valid for the call's class of tag
      (a job: <queue>/<job id>; a queue name; a shard: <queue> or
      <queue>~<n>; a stream of work: a job's or a shard's);
    - every ARGV[i] matches its declared type (integer range, enum, name,
      token, stream entry id, intent, bounded text, pattern), the repeated groups and
      the optional last group included, and nothing is left over;
    - a key bound to an argument (a worker's hash) ends with that argument;
  and returns the tag, or nil and an error reply: the function then returns
  that reply before it has written anything.

  sq_publish(channel, message) publishes with SPUBLISH on a Redis Cluster and
  PUBLISH elsewhere, decided here (from the server's cluster_enabled), never
  by the caller. Channels are built by the functions from the validated tag.
]]
-- (string.* is reached at call time: a library's load sees no standard library)

local function sq_name_ok(v)
  return #v <= 128 and string.find(v, "^[%w_%.:%-]+$") ~= nil
end

local function sq_job_tag_ok(v)  -- "<queue>/<job id>"
  local q, j = string.match(v, "^([^/]+)/([^/]+)$")
  return q ~= nil and sq_name_ok(q) and sq_name_ok(j)
end

local function sq_shard_tag_ok(v)  -- "<queue>" or "<queue>~<n>"
  local q, n = string.match(v, "^([^~]+)~(%d+)$")
  if q then return #n <= 4 and sq_name_ok(q) end
  return sq_name_ok(v)
end


local function sq_work_tag_ok(v)  -- a stream of work: a job's tasks or a shard's lane
  return sq_shard_tag_ok(v) or sq_job_tag_ok(v)
end

-- the argument checks each function's guard calls (streamq/storage/guard_lua.py writes
-- those guards out from the contracts: a check of "" apart, where "" means "none")
local function sq_int_ok(v, lo, hi)
  if #v > 16 or not string.find(v, "^%-?%d+$") or (#v == 16 and string.sub(v, 1, 1) ~= "-")
  then
    return false
  end
  local n = tonumber(v)
  return n >= lo and n <= hi
end

local function sq_entry_ok(v)
  if #v > 41 or not string.find(v, "^%d+%-%d+$") then return false end
  if #v <= 21 then return true end  -- both parts fit in 20 digits (most ids)
  local ms, seq = string.match(v, "^(%d+)%-(%d+)$")
  return #ms <= 20 and #seq <= 20
end

local function sq_intent_ok(v)  -- "<job id>" or "<job id>|<dedup key>"
  local job, dedup = string.match(v, "^([^|]*)|(.*)$")
  if not job then return sq_name_ok(v) end
  return sq_name_ok(job) and #dedup <= 300 and string.find(dedup, "^[!-z|~]+$") ~= nil
end

-- whether `key`'s part from `at` on (after its "sq:{<tag>}:") is the `exact` part or
-- matches `pattern` without ending with `never`: compared in place, no substring made
local function sq_part_ok(key, at, exact, pattern, never)
  if exact and #key == at - 1 + #exact and string.find(key, exact, at, true) == at then
    return true
  end
  if not string.find(key, pattern, at) then return false end
  return not (never and #key - #never + 1 >= at and
              string.find(key, never, #key - #never + 1, true) ~= nil)
end

-- whether `key` ends with ":<v>" (a worker's hash and its id)
local function sq_bound(key, v)
  return #key >= #v + 1 and string.find(key, ":" .. v, #key - #v, true) ~= nil
end

local function sq_refuse(fname, what)
  return nil, redis.error_reply("ERR " .. fname .. " refused: " .. what)
end

-- why KEYS[i] (`key`) was refused: not streamq's, of another tag than KEYS[1]'s
-- (`prefix`), or not of its kind
local function sq_key_refused(fname, i, key, prefix)
  if i > 1 and string.find(key, prefix, 1, true) ~= 1 then
    if not string.find(key, "^sq:{[^{}]*}:") then
      return sq_refuse(fname, "KEYS[" .. i .. "] is not a streamq key")
    end
    return sq_refuse(fname, "KEYS[" .. i .. "] is not of KEYS[1]'s tag")
  end
  return sq_refuse(fname, "KEYS[" .. i .. "] is not a key of the kind it must be")
end

-- the tag of a key, unchecked: what a function built without its guard uses
local function sq_tag_of(key)
  return string.match(key, "^sq:{([^{}]*)}:")
end

-- a shard's completion channel (a job's is this followed by ":<job id>"), from the
-- tag the guard checked (streamq.keys.QueueKeys.channel)
local function sq_channel(tag)
  return "sq:{" .. tag .. "}:done"
end

-- the queue a shard's tag belongs to: "<queue>" or "<queue>~<n>"
local function sq_queue_of(tag)
  return string.match(tag, "^[^~]+")
end

local sq_sharded
local function sq_publish(channel, message)
  if sq_sharded == nil then
    sq_sharded = string.find(redis.call("INFO", "cluster"), "cluster_enabled:1", 1, true) ~= nil
  end
  if sq_sharded then return redis.call("SPUBLISH", channel, message) end
  return redis.call("PUBLISH", channel, message)
end
