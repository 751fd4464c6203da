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
  - when it removed fewer than #ids, some were acknowledged ahead of an older
    entry still in flight: XDEL all of `ids` (those already trimmed are
    no-ops). With nothing pending, XDEL `ids` directly.
  No unacknowledged entry is removed; every id in `ids` is gone on return.
]]
local function delete_settled(tasksKey, group, ids)
  local head = rcall("XPENDING", tasksKey, group, "-", "+", 1)
  if #head > 0 and rcall("XTRIM", tasksKey, "MINID", head[1][1]) >= #ids then
    return
  end
  chunked("XDEL", tasksKey, ids)
end
