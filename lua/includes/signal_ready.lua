--[[
  Wake idle workers: make the wake list hold as many signals as there are
  ready tokens, capped at `cap`, so each blocked worker that can get a token
  is woken and stale signals stay bounded.
]]
--- @include "includes/push_signals"

local function signal_ready(readyKey, wakeKey, cap)
  local want = rcall("ZCARD", readyKey)
  if want > cap then want = cap end
  push_signals(wakeKey, want - rcall("LLEN", wakeKey))
end
