--[[
  Hand back entries a consumer read but never started: each entry of ARGV[first..]
  still pending with `consumer` is acknowledged and deleted and, when
  keep(fields) says so, copied (all fields) to a new entry at the end of the
  stream, so another worker reads it as new and no delivery is spent. The copy
  keeps when the entry was first queued: field "q" (ms, the first id's time),
  added after the others unless the entry has it already, so the queue wait a
  worker measures counts from then, not from the hand-back. An entry not
  pending with that consumer (reclaimed meanwhile) is left alone. Returns how
  many were copied.
]]
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
        local args, queued = {"XADD", stream, "*"}, false
        for k = 1, #fields do
          args[#args + 1] = fields[k]
          if k % 2 == 1 and fields[k] == "q" then queued = true end
        end
        if not queued then
          args[#args + 1] = "q"
          args[#args + 1] = string.match(id, "^%d+")
        end
        rcall(unpack(args))
        moved = moved + 1
      end
    end
  end
  return moved
end
