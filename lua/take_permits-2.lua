--[[
  Take permits to start sub-requests from a queue's rate limits (token
  buckets), or give unused ones back. A limit is stored in `rates` as
  "<per second>|<burst>" under field "queue" (every sub-request of the queue)
  or "client:<name>" (that client's); a start needs a permit from the
  client's bucket and from the queue's, when each is limited. A bucket's
  state in `buckets` is "<tokens>|<ms of its last refill>": it refills at
  the rate (Redis's clock) up to the burst, starts full, and a client
  without a limit takes from the queue's bucket only. One call handles its
  pairs in order, each seeing what the earlier ones took. Every bucket of the
  queue lives in its first shard's slot: one bucket per limit, whatever the
  number of shards.

  Input:
    KEYS[1] rates    sq:{<queue>}:rates    HASH "queue" | "client:<name>" -> "<per second>|<burst>"
    KEYS[2] buckets  sq:{<queue>}:buckets  HASH same fields -> "<tokens>|<ms>"
    ARGV[1..] pairs (client, n): n > 0 takes up to n permits, n < 0 gives -n back
      (permits taken earlier and not used; never beyond the burst)

  Output:
    flat list {granted1, wait1, granted2, wait2, ...}: permits granted (0 for a
    give back) and, when fewer than asked were granted, ms until the next
    permit (else 0)
]]
local rcall = redis.call
local ratesKey, bucketsKey = KEYS[1], KEYS[2]

--- @include "includes/now_ms"

local nowMs = now_ms()
local seen = {}

-- the bucket of a limit field, refilled to now; false when that field has no limit
local function bucket(field)
  local b = seen[field]
  if b ~= nil then return b end
  b = false
  local spec = rcall("HGET", ratesKey, field)
  if spec then
    local r, cap = string.match(spec, "^([^|]+)|([^|]+)$")
    local rate, burst = tonumber(r), tonumber(cap)
    if rate and burst and rate > 0 then
      local tokens = burst
      local state = rcall("HGET", bucketsKey, field)
      if state then
        local t, l = string.match(state, "^([^|]+)|([^|]+)$")
        local last = tonumber(l) or nowMs
        tokens = tonumber(t) or burst
        if nowMs > last then tokens = tokens + (nowMs - last) * rate / 1000 end
        if tokens > burst then tokens = burst end
      end
      b = {field = field, rate = rate, burst = burst, tokens = tokens}
    end
  end
  seen[field] = b
  return b
end

local out = {}
local touched = {}
for j = 1, #ARGV, 2 do
  local n = tonumber(ARGV[j + 1])
  local limits = {}
  for _, field in ipairs({"client:" .. ARGV[j], "queue"}) do
    local b = bucket(field)
    if b then
      limits[#limits + 1] = b
      touched[field] = b
    end
  end
  local granted, wait = 0, 0
  if n > 0 then
    granted = n
    for _, b in ipairs(limits) do
      local whole = math.floor(b.tokens)
      if whole < granted then granted = whole end
    end
    if granted < 0 then granted = 0 end
    for _, b in ipairs(limits) do
      b.tokens = b.tokens - granted
      if granted < n and b.tokens < 1 then
        local w = math.ceil((1 - b.tokens) * 1000 / b.rate)
        if w > wait then wait = w end
      end
    end
    if granted < n and wait < 1 then wait = 1 end
  elseif n < 0 then
    for _, b in ipairs(limits) do
      b.tokens = b.tokens - n
      if b.tokens > b.burst then b.tokens = b.burst end
    end
  end
  out[#out + 1] = granted
  out[#out + 1] = wait
end
for field, b in pairs(touched) do
  rcall("HSET", bucketsKey, field, string.format("%.6f", b.tokens) .. "|" .. nowMs)
end
return out
