--[[
  Move the due members of a retry ZSET back into their stream, for a job's own
  stream and a small-job lane alike: each becomes a new entry carrying its
  attempt count and marked suspect ("s" = 1: the worker records its start, so
  a kill inside the handler on a retry counts an attempt), with its trace
  context (field "c") when it has one. The caller gives the layout:
  `parse(member)` returns the attempts, the value of the entry's id field,
  the payload type, the trace context ("" for none) and the payload (nil for
  a member it cannot read, which is dropped), and `idField` names that field
  ("i", a job's sub-request index; "j", a small job's id); `ready()` runs
  once before the first entry goes back (a lane dropped while idle is made
  again). At most `most` members move. Returns how many moved, and the
  score of the next member left (nil when none waits).
]]
local function move_due(retryKey, stream, idField, parse, ready, nowMs, most)
  local moved = 0
  local due = rcall("ZRANGEBYSCORE", retryKey, "-inf", nowMs, "LIMIT", 0, most)
  if #due > 0 then ready() end
  for _, member in ipairs(due) do
    local a, id, t, c, p = parse(member)
    if a and c ~= "" then
      rcall("XADD", stream, "*", idField, id, "t", t, "p", p, "a", a, "s", 1, "c", c)
      moved = moved + 1
    elseif a then
      rcall("XADD", stream, "*", idField, id, "t", t, "p", p, "a", a, "s", 1)
      moved = moved + 1
    end
    rcall("ZREM", retryKey, member)
  end
  local nextDue = rcall("ZRANGE", retryKey, 0, 0, "WITHSCORES")
  return moved, nextDue[2]
end
