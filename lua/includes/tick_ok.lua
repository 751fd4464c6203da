--[[
  Whether a repeat's tick, computed by its caller from Redis's clock read a
  moment before, is one to store: at most a minute before this script's now,
  at most a year and a day after it.
]]
--- @include "includes/now_ms"
local function tick_ok(tick)
  local now = now_ms()
  return tick >= now - 60000 and tick <= now + 367 * 86400000
end
