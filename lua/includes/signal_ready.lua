--[[
  Wake idle workers: make the wake list hold as many signals as there are
  ready tokens, capped at `cap`, so each blocked worker that can get a token
  is woken and stale signals stay bounded.
]]
local function signal_ready(readyKey, wakeKey, cap)
  local want = rcall("ZCARD", readyKey)
  if want > cap then want = cap end
  local missing = want - rcall("LLEN", wakeKey)
  while missing > 0 do  -- one LPUSH of the missing signals (of at most 500)
    local n = math.min(missing, 500)
    local signals = {}
    for k = 1, n do signals[k] = "1" end
    rcall("LPUSH", wakeKey, unpack(signals))
    missing = missing - n
  end
end
