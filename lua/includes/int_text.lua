--[[
  int_text(n): the text of a whole number n, as Redis and Lua would write it.
  Lua turns a number into text with printf's "%.14g", and Redis turns a number
  given to redis.call into text with "%.17g": a float conversion that, made for
  every job of a call (a clock in ms has 13 digits), cost more than the commands
  it was passed to. "%d" is an integer conversion; a script makes the texts that
  every job of a call shares (its clock) once per call.
]]
local function int_text(n)
  if n == 0 then return "0" elseif n == 1 then return "1" end
  return string.format("%d", n)
end
