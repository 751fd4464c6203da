--[[
  The one clock: Redis's own. Every deadline, lease, retention cut-off and
  ordering decision a script makes reads the time here (TIME inside the
  script), never from the caller, whose clock may drift by seconds.
  Returns milliseconds since the epoch as an integer.
]]
local function now_ms()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
