--[[
  chunked(cmd, key, items): run `cmd key item...` over a list in slices of
  at most 500 items, so a long list is never unpacked onto the Lua stack
  whole. A list of pairs (field, value) must have an even length: 500 is
  even, so no pair is split. Returns the sum of the integer replies.

  chunked_hmget(key, fields): HMGET of every field, in slices of 500; the values
  (false for a missing field) in the order of `fields`.
]]
local function chunked(cmd, key, items)
  local total = 0
  for i = 1, #items, 500 do
    total = total + rcall(cmd, key, unpack(items, i, math.min(i + 499, #items)))
  end
  return total
end

local function chunked_hmget(key, fields)
  local out = {}
  for i = 1, #fields, 500 do
    local got = rcall("HMGET", key, unpack(fields, i, math.min(i + 499, #fields)))
    for k = 1, #got do out[i + k - 1] = got[k] end
  end
  return out
end
