--[[
  delete_settled(tasksKey, group, ids): delete entries that were just
  acknowledged (`ids`, in any order) from a job's stream, and nothing else.

  XDEL walks the entry's stream node from its head to the entry (up to 100
  entries, deleted ones included), so an XDEL per entry costs several times
  its XACK. Most acknowledgements settle the oldest entries in flight, and
  those are cheaper to cut off the head:
  - every entry below the oldest pending one is settled: XREADGROUP `>`
    delivers in id order, so such an entry was delivered and is no longer
    pending (acknowledged and deleted here, or moved and deleted by requeue,
    fail or reclaim, which re-add work as new entries at the end of the
    stream). `XTRIM MINID <oldest pending id>` removes them in one pass over
    one stream node, and since every other settled entry was deleted when it
    was settled, what it removes is exactly the `ids` below that threshold.
    With nothing pending, every delivered entry is settled: the threshold is
    the group's last-delivered id, and that entry is deleted with XDEL.
  - when it removed fewer than #ids, some were acknowledged ahead of an older
    entry still in flight: XDEL all of `ids` (those already removed are
    no-ops). A single id with nothing pending is deleted with XDEL directly.
  No unacknowledged entry is removed; every id in `ids` is gone on return.
]]
local function last_delivered(tasksKey, group)
  for _, g in ipairs(rcall("XINFO", "GROUPS", tasksKey)) do
    local name, last
    for i = 1, #g, 2 do
      if g[i] == "name" then name = g[i + 1] elseif g[i] == "last-delivered-id" then last = g[i + 1] end
    end
    if name == group then return last end
  end
end

local function delete_settled(tasksKey, group, ids)
  local head = rcall("XPENDING", tasksKey, group, "-", "+", 1)
  local removed
  if #head > 0 then
    removed = rcall("XTRIM", tasksKey, "MINID", head[1][1])
  elseif #ids == 1 then
    removed = 0  -- one entry (a one-sub-request job): XDEL is as cheap as anything
  else
    local last = last_delivered(tasksKey, group)
    removed = 0
    if last then
      removed = rcall("XTRIM", tasksKey, "MINID", last) + rcall("XDEL", tasksKey, last)
    end
  end
  if removed < #ids then chunked("XDEL", tasksKey, ids) end
end
