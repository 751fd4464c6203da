--[[
  Hand back entries a consumer read but never started: each entry of ARGV[first..]
  still pending with `consumer` is acknowledged and deleted and, when
  keep(fields) says so, copied (all fields) to a new entry at the end of the
  stream, so another worker reads it as new and no delivery is spent. The copy
  keeps when the entry was first queued (includes/copy_entry). An entry not
  pending with that consumer (reclaimed meanwhile) is left alone. Returns how
  many were copied.
]]
--- @include "includes/copy_entry"
local function hand_back(stream, group, consumer, first, keep)
  local moved = 0
  for j = first, #ARGV do
    local id = ARGV[j]
    local pending = rcall("XPENDING", stream, group, id, id, 1, consumer)
    local entry = rcall("XRANGE", stream, id, id)
    if #pending == 1 and #entry == 1 then
      rcall("XACK", stream, group, id)
      rcall("XDEL", stream, id)
      local fields = entry[1][2]
      if keep(fields) then
        copy_entry(stream, id, fields)
        moved = moved + 1
      end
    end
  end
  return moved
end
