--[[
  streamq's guard: the code every function of the library runs before its own
  (streamq/storage/contract.py emits the call and each function's declared contract,
  SQ_SPECS[<script>], from streamq/storage/contracts.py).

  sq_guard(spec, KEYS, ARGV) checks that
    - there are exactly as many KEYS as declared;
    - every KEYS[i] is sq:{<tag>}:<kind_i> (plus the suffix its kind declares),
      with one tag for the whole call, valid for the call's class of tag
      (a job: <queue>/<job id>; a queue name; a shard: <queue> or
      <queue>~<n>; a stream of work: a job's or a shard's);
    - every ARGV[i] matches its declared type (integer range, enum, name,
      token, stream entry id, intent, bounded text, pattern), the repeated groups and
      the optional last group included, and nothing is left over;
    - a key bound to an argument (a worker's hash, a lane's stream) ends with
      that argument;
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

local SQ_TAG_OK = {
  job = sq_job_tag_ok,
  queue = sq_name_ok,
  shard = sq_shard_tag_ok,
  -- a stream of work: a job's tasks or a shard's lane
  work = function(v) return sq_shard_tag_ok(v) or sq_job_tag_ok(v) end,
}

local function sq_arg_ok(s, v)
  if v == "" then return s.e end
  local t = s[1]
  if t == "i" then
    local d = string.match(v, "^%-?(%d+)$")
    if not d or #d > 15 then return false end
    local n = tonumber(v)
    return n >= s[2] and n <= s[3]
  elseif t == "e" then
    return s[2][v] == true
  elseif t == "n" then
    return sq_name_ok(v)
  elseif t == "t" then
    return #v <= s[2] and string.find(v, "^[!-z|~]+$") ~= nil
  elseif t == "x" then
    if #v > 41 or not string.find(v, "^%d+%-%d+$") then return false end
    if #v <= 21 then return true end  -- both parts fit in 20 digits (most ids)
    local ms, seq = string.match(v, "^(%d+)%-(%d+)$")
    return #ms <= 20 and #seq <= 20
  elseif t == "b" then
    return #v <= s[2]
  elseif t == "j" then
    local job, dedup = string.match(v, "^([^|]*)|(.*)$")
    if not job then return sq_name_ok(v) end
    return sq_name_ok(job) and #dedup <= 300 and string.find(dedup, "^[!-z|~]+$") ~= nil
  end
  if #v > s[2] then return false end
  for _, pat in ipairs(s[3]) do
    if string.find(v, pat) then return true end
  end
  return false
end

-- checks ARGV[i..] against the list of specs; returns the next position, or nil and why
local function sq_check_list(list, ARGV, i)
  for j = 1, #list do
    local s = list[j]
    local v = ARGV[i]
    if v == nil then return nil, "ARGV[" .. i .. "] (" .. s.d .. ") is missing" end
    if s[1] == "c" then
      local d = string.match(v, "^(%d+)$")
      local c = d and #d <= 6 and tonumber(d)
      if not c or c > s[2] then
        return nil, "ARGV[" .. i .. "] (" .. s.d .. ") must be a count in 0.." .. s[2]
      end
      i = i + 1
      for _ = 1, c do
        local err
        i, err = sq_check_list(s[3], ARGV, i)
        if not i then return nil, err end
      end
    else
      if not sq_arg_ok(s, v) then return nil, "ARGV[" .. i .. "] must be " .. s.d end
      i = i + 1
    end
  end
  return i
end

local function sq_guard(spec, KEYS, ARGV)
  local refuse = function(what)
    return nil, redis.error_reply("ERR " .. spec.f .. " refused: " .. what)
  end
  local kinds = spec.k
  if #KEYS ~= #kinds then return refuse("takes " .. #kinds .. " keys, got " .. #KEYS) end
  local tag
  for i = 1, #kinds do
    local t, part = string.match(KEYS[i], "^sq:{([^{}]*)}:(.*)$")
    if not t then return refuse("KEYS[" .. i .. "] is not a streamq key") end
    if i == 1 then
      if not SQ_TAG_OK[spec.tc](t) then return refuse("KEYS[1] has an invalid tag") end
      tag = t
    elseif t ~= tag then
      return refuse("KEYS[" .. i .. "] is not of KEYS[1]'s tag")
    end
    local kind = kinds[i]
    if part ~= kind.x and not (kind.p and string.find(part, kind.p)
                              and not (kind.n and string.sub(part, -#kind.n) == kind.n)) then
      return refuse("KEYS[" .. i .. "] is not a key of the kind it must be")
    end
  end
  local n, err = #ARGV, nil
  local i = 1
  i, err = sq_check_list(spec.a, ARGV, i)
  if not i then return refuse(err) end
  local r, t = spec.r, spec.t
  if #r > 0 then
    local groups = 0
    while n - i + 1 >= #r and not (#t > 0 and n - i + 1 == #t and #t < #r) do
      i, err = sq_check_list(r, ARGV, i)
      if not i then return refuse(err) end
      groups = groups + 1
    end
    if groups < spec.least then return refuse("needs at least " .. spec.least .. " groups") end
  end
  if #t > 0 and n - i + 1 == #t then
    i, err = sq_check_list(t, ARGV, i)
    if not i then return refuse(err) end
  end
  if i ~= n + 1 then return refuse((n - i + 1) .. " argument(s) more than it takes") end
  for _, b in ipairs(spec.b) do
    local v = ARGV[b[2]]
    if string.sub(KEYS[b[1]], -#v - 1) ~= ":" .. v then
      return refuse("KEYS[" .. b[1] .. "] is not ARGV[" .. b[2] .. "]'s key")
    end
  end
  return tag
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
