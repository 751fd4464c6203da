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
      token, stream entry id, intent, bounded text (UTF-8 where it is declared
      so), pattern), the repeated groups and the optional last group included,
      and nothing is left over;
    - a lane key bound to a lane member ("<prio>|<client>") is that member's
      lane, sq:{<tag>}:lane:<prio>:<client> (or its retry set, + ":retry"), the
      priority written without a leading zero, the client a name of at most 128
      characters (as every name): workers read the lane a member
      names, so entries written under another member would be read by none;
    - a key named after arguments (a worker's hash, a dead letter's marker) is
      its kind's part and those arguments joined by "|", and a lane's retry set named beside its
      lane is that lane's (+ ":retry");
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

-- whether v is valid UTF-8 (as Python's strict decoder takes it: no overlong form, no
-- surrogate, nothing past U+10FFFF). Each well-formed sequence becomes one ASCII byte
-- (so no two bytes left around it join), then no byte past ASCII may remain: a few
-- passes of C over the text, none for an ASCII one
local SQ_UTF8 = {
  "[\194-\223][\128-\191]",
  "\224[\160-\191][\128-\191]", "[\225-\236\238\239][\128-\191][\128-\191]",
  "\237[\128-\159][\128-\191]",
  "\240[\144-\191][\128-\191][\128-\191]",
  "[\241-\243][\128-\191][\128-\191][\128-\191]",
  "\244[\128-\143][\128-\191][\128-\191]",
}
local function sq_utf8_ok(v)
  if not string.find(v, "[\128-\255]") then return true end
  for _, p in ipairs(SQ_UTF8) do v = string.gsub(v, p, "_") end
  return not string.find(v, "[\128-\255]")
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
    if #v > 16 or not string.find(v, "^%-?%d+$") or (#v == 16 and string.sub(v, 1, 1) ~= "-")
    then
      return false
    end
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
    return #v <= s[2] and not (s.u and not sq_utf8_ok(v))
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

-- checks ARGV[i..] against the list of specs; returns the next position, or nil and why.
-- The commonest checks (bounded bytes, names, integers) are made here, inline: this
-- runs for every argument of every call (a batch's entries are most of them)
local function sq_check_list(list, ARGV, i)
  for j = 1, #list do
    local s = list[j]
    local v = ARGV[i]
    if v == nil then return nil, "ARGV[" .. i .. "] (" .. s.d .. ") is missing" end
    local t = s[1]
    if t == "b" then
      if #v > s[2] or (v == "" and not s.e) or (s.u and not sq_utf8_ok(v)) then
        return nil, "ARGV[" .. i .. "] must be " .. s.d
      end
      i = i + 1
    elseif t == "c" then
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

local function sq_refuse(spec, what)
  return nil, redis.error_reply("ERR " .. spec.f .. " refused: " .. what)
end

-- whether KEYS[i] (`key`, its part starting at `at`) is of `kind`: compared in place,
-- no substring made (this runs for every key of every call)
local function sq_kind_ok(kind, key, at)
  local x = kind.x
  if x and #key == at - 1 + #x and string.find(key, x, at, true) == at then return true end
  local p = kind.p
  if not p or not string.find(key, p, at) then return false end
  local never = kind.n
  return not (never and #key - #never + 1 >= at and
              string.find(key, never, #key - #never + 1, true) ~= nil)
end

-- the checks of KEYS against the function's kinds (at least one: every contract names
-- its keys): the keys' tag, or nil and the refusal
local function sq_keys_ok(spec, KEYS, kinds)
  local tag = string.match(KEYS[1], "^sq:{([^{}]*)}:")
  if not tag then return sq_refuse(spec, "KEYS[1] is not a streamq key") end
  if not SQ_TAG_OK[spec.tc](tag) then return sq_refuse(spec, "KEYS[1] has an invalid tag") end
  local prefix = "sq:{" .. tag .. "}:"
  local at = #prefix + 1
  for i = 1, #kinds do
    local key = KEYS[i]
    if i > 1 and string.find(key, prefix, 1, true) ~= 1 then
      if not string.find(key, "^sq:{[^{}]*}:") then
        return sq_refuse(spec, "KEYS[" .. i .. "] is not a streamq key")
      end
      return sq_refuse(spec, "KEYS[" .. i .. "] is not of KEYS[1]'s tag")
    end
    if not sq_kind_ok(kinds[i], key, at) then
      return sq_refuse(spec, "KEYS[" .. i .. "] is not a key of the kind it must be")
    end
  end
  return tag
end

-- key lists that passed a function's key checks, by function: the list joined by NUL
-- (no valid key holds one, and the count is checked first, so a join names one list)
-- -> its tag. Checked once, looked up after (a shard's keys repeat on every call);
-- emptied when it holds SQ_SEEN_MAX lists
local SQ_SEEN, sq_seen_n, SQ_SEEN_MAX = {}, 0, 4096

local function sq_guard(spec, KEYS, ARGV)
  local kinds = spec.k
  if #KEYS ~= #kinds then return sq_refuse(spec, "takes " .. #kinds .. " keys, got " .. #KEYS) end
  local seen = SQ_SEEN[spec]
  local joined = table.concat(KEYS, "\0")
  local tag = seen and seen[joined]
  if not tag then
    local err
    tag, err = sq_keys_ok(spec, KEYS, kinds)
    if not tag then return nil, err end
    if sq_seen_n >= SQ_SEEN_MAX then SQ_SEEN, sq_seen_n = {}, 0 end
    seen = SQ_SEEN[spec]
    if not seen then seen = {}; SQ_SEEN[spec] = seen end
    seen[joined] = tag
    sq_seen_n = sq_seen_n + 1
  end

  local n, err = #ARGV, nil
  local i = 1
  i, err = sq_check_list(spec.a, ARGV, i)
  if not i then return sq_refuse(spec, err) end
  local r, t = spec.r, spec.t
  if #r > 0 then
    local groups = 0
    while n - i + 1 >= #r and not (#t > 0 and n - i + 1 == #t and #t < #r) do
      i, err = sq_check_list(r, ARGV, i)
      if not i then return sq_refuse(spec, err) end
      groups = groups + 1
    end
    if groups < spec.least then return sq_refuse(spec, "needs at least " .. spec.least .. " groups") end
  end
  if #t > 0 and n - i + 1 == #t then
    i, err = sq_check_list(t, ARGV, i)
    if not i then return sq_refuse(spec, err) end
  end
  if i ~= n + 1 then return sq_refuse(spec, (n - i + 1) .. " argument(s) more than it takes") end
  for _, b in ipairs(spec.lb) do
    local prio, client = string.match(ARGV[b[2]], "^(%d+)|(.*)$")
    local want = prio and (#prio == 1 or string.sub(prio, 1, 1) ~= "0") and #client <= 128 and
      "sq:{" .. tag .. "}:lane:" .. prio .. ":" .. client .. (b[3] and ":retry" or "")
    if KEYS[b[1]] ~= want then
      return sq_refuse(spec, "KEYS[" .. b[1] .. "] is not the lane of ARGV[" .. b[2] .. "]")
    end
  end
  for _, b in ipairs(spec.ko) do
    local parts = {}
    for n, a in ipairs(b[2]) do parts[n] = ARGV[a] end
    if KEYS[b[1]] ~= "sq:{" .. tag .. "}:" .. b[3] .. ":" .. table.concat(parts, "|") then
      return sq_refuse(spec, "KEYS[" .. b[1] .. "] is not ARGV[" .. table.concat(b[2], ",") ..
                       "]'s key")
    end
  end
  for _, b in ipairs(spec.ro) do
    if KEYS[b[1]] ~= KEYS[b[2]] .. ":retry" then
      return sq_refuse(spec, "KEYS[" .. b[1] .. "] is not KEYS[" .. b[2] .. "]'s retry set")
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
