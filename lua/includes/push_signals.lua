--[[
  push_signals(wakeKey, n): push `n` wake-up signals onto the wake list (none
  when `n` is 0 or less), in one LPUSH of at most 500 at a time. Each caller
  decides how many are missing (the list's length read, a cap applied), so a
  blocked worker is woken per piece of work and stale signals stay bounded.
]]
--- @include "includes/chunked"

local function push_signals(wakeKey, n)
  if n <= 0 then return end
  local signals = {}
  for k = 1, n do signals[k] = "1" end
  chunked("LPUSH", wakeKey, signals)
end
