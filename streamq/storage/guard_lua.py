"""Each function's guard, written out as straight-line Lua from its contract.

:func:`guard_lua` turns one :class:`~streamq.storage.contract.Contract` into the Lua
function that checks a call of it (``lua/library/guard.lua`` holds the helpers it
calls). Each key's kind, each argument's type, its bounds and its error text are
constants of the emitted code, so a call pays for the checks themselves and not for
reading a table that describes them: a fixed argument is read at a fixed position, a
repeated group in one loop with no per-argument dispatch, and a refusal builds its
message only when it refuses.

The emitted check is the same as :meth:`Contract.check` (its Python twin), with the
same error replies the generic guard gave: ``ERR sq_<name> refused: <what>``. The attack
suite (``tests/system/test_attacks.py``) compares the two on every mutated call.
"""

from __future__ import annotations

from typing import Any

from streamq.storage.contract import Arg, Contract, Counted, KeyKind, lua_string

__all__ = ["guard_lua"]

#: the tag check of each class of tag (guard.lua)
_TAG_CHECK = {"job": "sq_job_tag_ok", "queue": "sq_name_ok", "shard": "sq_shard_tag_ok",
              "work": "sq_work_tag_ok"}


def _value_ok(a: Arg) -> str:
    """A Lua expression: whether ``v`` (a string) passes ``a``'s check."""
    size = a.size
    if a.kind == "text":
        return f"(#v <= {size})"
    if a.kind == "enum":
        return "(" + " or ".join(f"v == {lua_string(x)}" for x in a.values) + ")"
    if a.kind == "int":
        expr = f"sq_int_ok(v, {a.lo}, {a.hi})"
    elif a.kind == "name":  # sq_name_ok, inline: a batch's job ids are most of its names
        expr = "(#v <= 128 and string.find(v, \"^[%w_%.:%-]+$\") ~= nil)"
    elif a.kind == "token":
        expr = f"(#v <= {size} and string.find(v, \"^[!-z|~]+$\") ~= nil)"
    elif a.kind == "entry":  # most ids are short enough for the first test alone
        expr = "((#v <= 21 and string.find(v, \"^%d+%-%d+$\") ~= nil) or sq_entry_ok(v))"
    elif a.kind == "intent":
        expr = "sq_intent_ok(v)"
    else:
        finds = " or ".join(f"string.find(v, {lua_string(p)})" for p in a.lua.split("\n"))
        expr = f"(#v <= {size} and ({finds}) ~= nil)"
    # "" is checked apart: it means "none" where the argument may be empty
    return f"(v == \"\" or {expr})" if a.empty else f"(v ~= \"\" and {expr})"


class _Emitter:
    """The lines of one guard function; ``at`` is an argument's position, a number
    while it is fixed, then ``i + <offset>`` once a count or a repeated group moved it."""

    def __init__(self, c: Contract) -> None:
        self.c = c
        self.lines: list[str] = []
        self.fixed: int | None = 1  # the next position while known, else None (``i``)

    def put(self, line: str, depth: int = 1) -> None:
        self.lines.append("  " * depth + line)

    def refuse(self, what: str) -> str:
        return f"return sq_refuse({lua_string('sq_' + self.c.name)}, {what})"

    def pos(self, offset: int = 0) -> str:
        return str(self.fixed + offset) if self.fixed is not None else (
            f"i + {offset}" if offset else "i")

    def arg(self, a: Arg, depth: int, offset: int = 0, *, may_miss: bool = True) -> None:
        """Check the argument at ``pos(offset)``."""
        p = self.pos(offset)
        label = f"{a.name}: {a.describe()}"
        self.put(f"v = ARGV[{p}]", depth)
        if may_miss:
            self.put(f"if v == nil then {self.refuse(self.at(p, f' ({label}) is missing'))} end",
                     depth)
        self.put(f"if not {_value_ok(a)} then {self.refuse(self.at(p, f' must be {label}'))} end",
                 depth)

    def at(self, p: str, what: str) -> str:
        """A Lua expression: ``ARGV[<p>]<what>``, one constant while ``p`` is."""
        if self.fixed is not None:
            return lua_string(f"ARGV[{p}]{what}")
        return f"\"ARGV[\" .. {p} .. {lua_string(']' + what)}"

    def group(self, args: tuple[Any, ...], depth: int) -> None:
        """Check ``args`` in order from the current position, moving it past them."""
        for a in args:
            if isinstance(a, Counted):
                self.counted(a, depth)
            else:
                self.arg(a, depth)
                self.advance(depth)

    def advance(self, depth: int, by: int = 1) -> None:
        if self.fixed is not None:
            self.fixed += by
        else:
            self.put(f"i = i + {by}", depth)

    def dynamic(self, depth: int) -> None:
        if self.fixed is not None:
            self.put(f"local i = {self.fixed}", depth)
            self.fixed = None

    def counted(self, a: Counted, depth: int) -> None:
        self.dynamic(depth)
        self.put("v = ARGV[i]", depth)
        self.put(f"if v == nil then {self.refuse(self.at('i', f' ({a.name}) is missing'))} end",
                 depth)
        self.put("local d = string.match(v, \"^(%d+)$\")", depth)
        self.put("local c = d and #d <= 6 and tonumber(d)", depth)
        msg = self.at("i", f" ({a.name}) must be a count in 0..{a.most}")
        self.put(f"if not c or c > {a.most} then {self.refuse(msg)} end", depth)
        self.put("i = i + 1", depth)
        self.put("for _ = 1, c do", depth)
        self.group(a.group, depth + 1)
        self.put("end", depth)

    def repeated(self) -> None:
        """The repeated group (every argument of it is there: the loop's test says so),
        then the optional last group, then nothing left over."""
        c, r, t = self.c, len(self.c.rest), len(self.c.tail)
        self.dynamic(1)
        self.put("local n = #ARGV")
        if r:
            if c.least:
                self.put("local groups = 0")
            # (a last group shorter than the repeated one never stops the loop early:
            # what is left is the last group only when fewer than r are left)
            self.put(f"while n - i + 1 >= {r} do")
            for k, a in enumerate(c.rest):
                self.arg(a, 2, k, may_miss=False)
            self.put(f"i = i + {r}", 2)
            if c.least:
                self.put("groups = groups + 1", 2)
            self.put("end")
            if c.least:
                self.put(f"if groups < {c.least} then "
                         f"{self.refuse(lua_string(f'needs at least {c.least} groups'))} end")
        if t:
            self.put(f"if n - i + 1 == {t} then")
            for k, a in enumerate(c.tail):
                self.arg(a, 2, k, may_miss=False)
            self.put(f"i = i + {t}", 2)
            self.put("end")
        more = "(n - i + 1) .. " + lua_string(" argument(s) more than it takes")
        self.put(f"if i ~= n + 1 then {self.refuse(more)} end")


def _keys(c: Contract, out: _Emitter) -> None:
    """The keys: their number, one valid tag, each of its declared kind."""
    n = c.numkeys
    out.put(f"if #KEYS ~= {n} then "
            f"{out.refuse(lua_string(f'takes {n} keys, got ') + ' .. #KEYS')} end")
    if not n:
        out.put("local tag = nil")
        return
    out.put("local tag = string.match(KEYS[1], \"^sq:{([^{}]*)}:\")")
    out.put(f"if not tag then {out.refuse(lua_string('KEYS[1] is not a streamq key'))} end")
    out.put(f"if not {_TAG_CHECK[c.tag_class]}(tag) then "
            f"{out.refuse(lua_string('KEYS[1] has an invalid tag'))} end")
    out.put("local prefix = \"sq:{\" .. tag .. \"}:\"")
    out.put("local at = #prefix + 1")
    for i, kind in enumerate(c.keys, 1):
        out.put(f"if not {_key_ok(kind, i)} then "
                f"return sq_key_refused({lua_string('sq_' + c.name)}, {i}, KEYS[{i}], prefix) end")


def _key_ok(kind: KeyKind, i: int) -> str:
    """A Lua expression: whether KEYS[i] is ``prefix`` (KEYS[1]'s) and a part of
    ``kind``."""
    key = f"KEYS[{i}]"
    if not kind.regex:
        return f"({key} == prefix .. {lua_string(kind.name)})"
    x = lua_string(kind.exact) if kind.exact else "nil"
    never = lua_string(kind.never_ends) if kind.never_ends else "nil"
    part = f"sq_part_ok({key}, at, {x}, {lua_string(kind.lua)}, {never})"
    # KEYS[1] has the prefix: the tag was read from it
    return part if i == 1 else f"(string.find({key}, prefix, 1, true) == 1 and {part})"


def guard_lua(c: Contract) -> str:
    """The Lua function (an expression) that checks a call of ``c``: it returns the
    call's tag, or nil and the error reply the function returns before it writes."""
    out = _Emitter(c)
    out.put("local v")
    _keys(c, out)
    out.group(c.args, 1)
    if c.rest or c.tail or out.fixed is None:
        out.repeated()
    else:
        n = out.fixed - 1
        out.put(f"if #ARGV ~= {n} then "
                f"{out.refuse(f'(#ARGV - {n}) .. ' + lua_string(' argument(s) more than it takes'))} end")
    for k, a in c.binds:
        out.put(f"if not sq_bound(KEYS[{k}], ARGV[{a}]) then "
                f"{out.refuse(lua_string(f'KEYS[{k}] is not ARGV[{a}]' + chr(39) + 's key'))} end")
    out.put("return tag")
    return "function(KEYS, ARGV)\n" + "\n".join(out.lines) + "\nend"
