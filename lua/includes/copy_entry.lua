--[[
  copy_entry(stream, id, fields): add a copy of entry `id` (its flat list of
  `fields`) at the end of `stream`, keeping when the entry was first queued:
  field "q" (ms, the first id's time), added after the others unless the entry
  has it already, so the queue wait a worker measures counts from then, not
  from the copy. Returns the copy's id. (An entry has a handful of fields: the
  list is unpacked whole.)
]]
local function copy_entry(stream, id, fields)
  local args, queued = {"XADD", stream, "*"}, false
  for k = 1, #fields do
    args[#args + 1] = fields[k]
    if k % 2 == 1 and fields[k] == "q" then queued = true end
  end
  if not queued then
    args[#args + 1] = "q"
    args[#args + 1] = string.match(id, "^%d+")
  end
  return rcall(unpack(args))
end
