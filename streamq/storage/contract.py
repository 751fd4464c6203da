"""The contract of a streamq script: its keys, arguments, reply, flags, errors, roles.

Every function of streamq's library is declared once, in :mod:`streamq.contracts`,
with the types of this module. From that one declaration come:

- the **prologue** every function runs first (:func:`prologue_lua`, emitted by
  :func:`streamq.luaload.build_library`): each ``KEYS[i]`` must be
  ``sq:{<tag>}:<kind_i>`` (plus the suffix its kind declares) with one valid tag
  for the whole call, and each ``ARGV`` must match its declared type; anything
  else is refused with a clean error reply before the script writes anything;
- the same check in Python (:meth:`Contract.check`), which the test suite turns on
  for every call the library sends (``STREAMQ_CHECK_CONTRACTS=1``), so a stub that
  disagrees with its declaration fails every test that uses it;
- the functions each ACL role may call (:mod:`streamq.roles`);
- the reference tables of docs/design/scripts.md (:func:`streamq.contracts.doc_tables`).

Functions are the security boundary (a role with streamq's module holds no write
command of its own): a function never takes a command name, a key prefix or a
channel prefix from its caller. Channels are built from the validated tag, and
the publish command (PUBLISH, or SPUBLISH on a cluster) is decided inside.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Arg", "Contract", "ContractError", "Counted", "KeyKind", "lua_string"]

#: queue names, job ids and client names (``keys.check_name``)
NAME_CHARS = r"[A-Za-z0-9_.:\-]"
_NAME_RE = re.compile(NAME_CHARS + r"{1,128}")
#: a shard's tag: the queue name, or ``<queue>~<n>``
_SHARD_RE = re.compile(NAME_CHARS + r"{1,128}(?:~[0-9]{1,4})?")
_KEY_RE = re.compile(r"sq:\{([^{}]*)\}:(.*)", re.DOTALL)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _utf8(v: bytes) -> bool:
    try:
        v.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class ContractError(ValueError):
    """Raised when a call does not match its script's declared contract."""


def lua_string(text: str) -> str:
    """A Lua string literal of ``text`` (ASCII)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# -- key kinds ---------------------------------------------------------------------------

#: the tag classes: a job's tag is ``<queue>/<job id>``, a shard's its queue name or
#: ``<queue>~<n>``, and a queue's first-shard keys (config, rates, buckets) carry the
#: queue name only
_JOB_RE = re.compile(_NAME_RE.pattern + "/" + _NAME_RE.pattern)
#: ... and a stream of work (``delete_consumers``) is a job's ``tasks`` or a shard's lane
TAG_CLASSES = {"job": _JOB_RE, "shard": _SHARD_RE, "queue": _NAME_RE,
               "work": re.compile(f"{_SHARD_RE.pattern}|{_JOB_RE.pattern}")}


@dataclass(frozen=True)
class KeyKind:
    """A kind of key: ``sq:{<tag>}:<part>``. ``part`` is the kind's ``name``, or for a
    kind with a suffix any text matching ``regex`` (Python) and ``lua`` (its Lua
    pattern twin); ``shown`` is how the docs write it (``worker:<id>``)."""

    name: str
    slot: str  #: "job", "shard" or "queue": the class of tag it carries
    redis_type: str
    regex: str = ""
    lua: str = ""
    shown: str = ""
    #: for a kind with a suffix: one exact part accepted too (a work stream is a job's
    #: ``tasks`` or a lane)
    exact: str = ""
    #: an ending the part may not have (a lane is never its own retry set)
    never_ends: str = ""

    def part_ok(self, part: str) -> bool:
        if not self.regex or part == self.exact:
            return part == (self.exact or self.name)
        if self.never_ends and part.endswith(self.never_ends):
            return False
        return re.fullmatch(self.regex, part, re.DOTALL) is not None

    @property
    def pattern(self) -> str:
        return self.shown or self.name

    def lua_spec(self) -> str:
        if not self.regex:
            return f"{{x={lua_string(self.name)}}}"
        x = f"x={lua_string(self.exact)}, " if self.exact else ""
        n = f", n={lua_string(self.never_ends)}" if self.never_ends else ""
        return f"{{{x}p={lua_string(self.lua)}{n}}}"


# -- argument types ----------------------------------------------------------------------

@dataclass(frozen=True)
class Arg:
    """One argument: ``kind`` is one of

    - ``int``: a decimal integer from ``lo`` to ``hi``;
    - ``enum``: one of ``values``;
    - ``name``: a queue name, job id or client name (1-128 of ``A-Za-z0-9_.:-``);
    - ``token``: an id the caller chooses (1-``size`` printable ASCII, no space, no
      braces);
    - ``entry``: a stream entry id ``<ms>-<seq>``;
    - ``text``: any bytes, at most ``size`` of them (``utf8``: valid UTF-8 only, for
      a text stored where its readers decode it);
    - ``intent``: a job id, or ``<job id>|<dedup key>`` (a submit's intent);
    - ``pattern``: text of at most ``size`` bytes matching ``regex`` (Lua: one of the
      patterns of ``lua``, one a line).

    ``empty``: "" is accepted too (meaning "none")."""

    name: str
    kind: str
    lo: int = 0
    hi: int = 0
    values: tuple[str, ...] = ()
    size: int = 0
    regex: str = ""
    lua: str = ""
    empty: bool = False
    doc: str = ""
    utf8: bool = False

    def describe(self) -> str:
        if self.kind == "int":
            what = f"an integer in {self.lo}..{self.hi}"
        elif self.kind == "enum":
            what = "one of " + "|".join(v or '""' for v in self.values)
        elif self.kind == "name":
            what = "a name (1-128 of A-Za-z0-9_.:-)"
        elif self.kind == "token":
            what = f"a token (1-{self.size} printable, no space or braces)"
        elif self.kind == "entry":
            what = "a stream entry id"
        elif self.kind == "text":
            what = ("UTF-8 text of " if self.utf8 else "") + f"at most {self.size} bytes"
        elif self.kind == "intent":
            what = "a job id, or <job id>|<dedup key>"
        else:
            what = f"text like {self.doc or self.regex} (at most {self.size} bytes)"
        return what + (' or ""' if self.empty and self.kind not in ("text", "enum") else "")

    def ok(self, value: Any) -> bool:
        """Whether ``value`` (as the caller would send it) passes the check."""
        v = value if isinstance(value, bytes) else str(value).encode()
        if v == b"":
            return self.empty or self.kind == "text" or (self.kind == "enum" and "" in self.values)
        if self.kind == "text":
            return len(v) <= self.size and (not self.utf8 or _utf8(v))
        try:
            t = v.decode("ascii")
        except UnicodeDecodeError:
            return False
        if self.kind == "int":
            return (re.fullmatch(r"-?[0-9]{1,15}", t) is not None
                    and self.lo <= int(t) <= self.hi)
        if self.kind == "enum":
            return t in self.values
        if self.kind == "name":
            return _NAME_RE.fullmatch(t) is not None
        if self.kind == "token":
            return (len(t) <= self.size and re.fullmatch(r"[!-z|~]+", t) is not None
                    and "{" not in t and "}" not in t)
        if self.kind == "entry":
            return re.fullmatch(r"[0-9]{1,20}-[0-9]{1,20}", t) is not None
        if self.kind == "intent":
            job, sep, dedup = t.partition("|")
            return (_NAME_RE.fullmatch(job) is not None
                    and (not sep or Arg("dedup", "token", size=300).ok(dedup)))
        return len(v) <= self.size and re.fullmatch(self.regex, t) is not None

    def lua_spec(self) -> str:
        e = "true" if self.empty else "false"
        label = lua_string(f"{self.name}: {self.describe()}")
        if self.kind == "int":
            return f"{{'i', {self.lo}, {self.hi}, e={e}, d={label}}}"
        if self.kind == "enum":
            vals = ", ".join(f"[{lua_string(v)}]=true" for v in self.values if v)
            e = "true" if "" in self.values else e
            return f"{{'e', {{{vals}}}, e={e}, d={label}}}"
        if self.kind == "name":
            return f"{{'n', e={e}, d={label}}}"
        if self.kind == "token":
            return f"{{'t', {self.size}, e={e}, d={label}}}"
        if self.kind == "entry":
            return f"{{'x', e={e}, d={label}}}"
        if self.kind == "text":
            u = ", u=true" if self.utf8 else ""
            return f"{{'b', {self.size}, e=true{u}, d={label}}}"
        if self.kind == "intent":
            return f"{{'j', e={e}, d={label}}}"
        pats = ", ".join(lua_string(p) for p in self.lua.split("\n"))
        return f"{{'p', {self.size}, {{{pats}}}, e={e}, d={label}}}"


@dataclass(frozen=True)
class Counted:
    """A count ``n`` (0..``most``) followed by ``n`` groups of ``group``."""

    name: str
    group: tuple[Arg, ...]
    most: int = 10_000


@dataclass(frozen=True)
class Contract:
    """The declaration of one script (see the module's docstring)."""

    name: str
    purpose: str
    keys: tuple[KeyKind, ...]
    args: tuple[Arg | Counted, ...] = ()
    #: a group repeated to the end of ARGV (0 or more times, at least ``least``)
    rest: tuple[Arg, ...] = ()
    least: int = 0
    #: an optional last group after the repeated ones (a trace context)
    tail: tuple[Arg, ...] = ()
    reply: str = ""
    errors: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    #: Redis function flags: "allow-oom" for what drains a full Redis
    flags: tuple[str, ...] = ()
    #: the function publishes completions (on channels built from its tag)
    publishes: bool = False
    #: pairs (key, arg): KEYS[key] is the lane stream (or its retry set, by its kind) of
    #: the lane member ARGV[arg] ("<prio>|<client>", the priority written as an integer
    #: is, no leading zero): a worker reads the lane a member names, so a lane written
    #: under another member would be read by none
    lane_binds: tuple[tuple[int, int], ...] = ()
    #: KEYS[key] is its kind's part followed by the ARGV values at the positions given
    #: (1-based), joined by "|": a worker's hash is ``worker:<its id>``, a dead letter's
    #: marker names the letter the call copies; pairs (key, positions)
    key_of: tuple[tuple[int, tuple[int, ...]], ...] = ()
    #: pairs (key, other): KEYS[key] is KEYS[other]'s retry set (KEYS[other] + ":retry")
    retry_of: tuple[tuple[int, int], ...] = ()
    slot: str = field(init=False, default="")

    def __post_init__(self) -> None:
        if not self.keys:  # the guard's checks start from KEYS[1]'s tag
            raise ValueError(f"{self.name}: a function names the keys it touches")
        slots = {k.slot for k in self.keys}
        slot = "job" if slots == {"job"} else "queue" if "job" not in slots else "?"
        if slot == "?":
            raise ValueError(f"{self.name}: keys of a job and of a queue in one call")
        object.__setattr__(self, "slot", slot)
        for key_i, _ in self.lane_binds:
            if self.keys[key_i - 1].name not in ("lane", "lane-retry"):
                raise ValueError(f"{self.name}: KEYS[{key_i}] bound to a lane member is no lane")
        for key_i, _ in self.key_of:
            if not self.keys[key_i - 1].regex:
                raise ValueError(f"{self.name}: KEYS[{key_i}] has no part to bind")
        for key_i, other in self.retry_of:
            if (self.keys[key_i - 1].name, self.keys[other - 1].name) != ("lane-retry", "lane"):
                raise ValueError(f"{self.name}: KEYS[{key_i}] is not KEYS[{other}]'s retry set")

    @property
    def numkeys(self) -> int:
        return len(self.keys)

    @property
    def tag_class(self) -> str:
        slots = {k.slot for k in self.keys}
        if any(k.name == "work" for k in self.keys):
            return "work"  # a job's stream or a shard's lane
        return "job" if "job" in slots else "queue" if "queue" in slots else "shard"

    # -- the Python twin of the Lua prologue --

    def check(self, keys: Any, args: Any) -> str:
        """Raise :class:`ContractError` unless ``keys`` and ``args`` fit; return the
        tag."""
        if len(keys) != self.numkeys:
            raise ContractError(f"{self.name}: takes {self.numkeys} keys, got {len(keys)}")
        tag = ""
        for i, (key, kind) in enumerate(zip(keys, self.keys), 1):
            k = key.decode() if isinstance(key, bytes) else str(key)
            m = _KEY_RE.fullmatch(k)
            if m is None:
                raise ContractError(f"{self.name}: KEYS[{i}] {k!r} is not a streamq key")
            if i == 1:
                tag = m[1]
                if TAG_CLASSES[self.tag_class].fullmatch(tag) is None:
                    raise ContractError(f"{self.name}: KEYS[1] has an invalid tag {tag!r}")
            elif m[1] != tag:
                raise ContractError(f"{self.name}: KEYS[{i}] {k!r} is not of tag {tag!r}")
            if not kind.part_ok(m[2]):
                raise ContractError(f"{self.name}: KEYS[{i}] {k!r} is not a {kind.pattern} key")
        self._check_args(list(args))
        for key_i, arg_i in self.lane_binds:
            if _text(keys[key_i - 1]) != f"sq:{{{tag}}}:" + self._lane_part(key_i, args[arg_i - 1]):
                raise ContractError(f"{self.name}: KEYS[{key_i}] is not the lane of ARGV[{arg_i}]")
        for key_i, at in self.key_of:
            want = "|".join(_text(args[a - 1]) for a in at)
            if _text(keys[key_i - 1]) != f"sq:{{{tag}}}:{self.keys[key_i - 1].name}:{want}":
                raise ContractError(f"{self.name}: KEYS[{key_i}] is not "
                                    f"ARGV[{','.join(map(str, at))}]'s key")
        for key_i, other in self.retry_of:
            if _text(keys[key_i - 1]) != _text(keys[other - 1]) + ":retry":
                raise ContractError(f"{self.name}: KEYS[{key_i}] is not KEYS[{other}]'s retry set")
        return tag

    def _lane_part(self, key_i: int, member: Any) -> str:
        """The key part of the lane (or retry set, by KEYS[key_i]'s kind) of ``member``;
        "" (no key's) for a member whose priority has a leading zero."""
        prio, _, client = _text(member).partition("|")
        if prio != str(int(prio)):
            return ""
        return f"lane:{prio}:{client}" + (":retry" if self.keys[key_i - 1].name == "lane-retry"
                                          else "")

    def _check_args(self, args: list[Any]) -> None:
        i = 0

        def one(arg: Arg) -> None:
            nonlocal i
            if i >= len(args):
                raise ContractError(f"{self.name}: ARGV[{i + 1}] ({arg.name}) is missing")
            if not arg.ok(args[i]):
                raise ContractError(f"{self.name}: ARGV[{i + 1}] ({arg.name}) must be "
                                    f"{arg.describe()}, got {str(args[i])[:60]!r}")
            i += 1

        for a in self.args:
            if isinstance(a, Counted):
                count = Arg(a.name, "int", 0, a.most)
                one(count)
                for _ in range(int(args[i - 1])):
                    for g in a.group:
                        one(g)
            else:
                one(a)
        left = len(args) - i
        groups = 0
        if self.rest:
            while left >= len(self.rest) and not (self.tail and left == len(self.tail)
                                                  and left < len(self.rest)):
                for g in self.rest:
                    one(g)
                left -= len(self.rest)
                groups += 1
            if groups < self.least:
                raise ContractError(f"{self.name}: needs at least {self.least} groups")
        if self.tail and left == len(self.tail):
            for g in self.tail:
                one(g)
            left = 0
        if left:
            raise ContractError(f"{self.name}: {left} argument(s) more than it takes")

    # -- the Lua prologue --

    def lua_spec(self) -> str:
        """The Lua table the library's guard checks a call of this script against."""
        def arglist(args: tuple[Any, ...]) -> str:
            out = []
            for a in args:
                if isinstance(a, Counted):
                    out.append(f"{{'c', {a.most}, {{{arglist(a.group)}}}, "
                               f"d={lua_string(a.name)}}}")
                else:
                    out.append(a.lua_spec())
            return ", ".join(out)

        keys = ", ".join(k.lua_spec() for k in self.keys)
        lanes = ", ".join(f"{{{k}, {a}, {'true' if self.keys[k - 1].name == 'lane-retry' else 'false'}}}"
                          for k, a in self.lane_binds)
        key_of = ", ".join(f"{{{k}, {{{', '.join(map(str, at))}}}, "
                           f"{lua_string(self.keys[k - 1].name)}}}" for k, at in self.key_of)
        retry_of = ", ".join(f"{{{k}, {o}}}" for k, o in self.retry_of)
        return (f"{{f={lua_string('sq_' + self.name)}, tc={lua_string(self.tag_class)}, "
                f"k={{{keys}}}, a={{{arglist(self.args)}}}, r={{{arglist(self.rest)}}}, "
                f"least={self.least}, t={{{arglist(self.tail)}}}, "
                f"lb={{{lanes}}}, ko={{{key_of}}}, ro={{{retry_of}}}}}")
