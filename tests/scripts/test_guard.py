"""Each function's guard (``lua/library/guard.lua`` with the function's declared contract)
against the contract's Python twin (``Contract.check``), on every function of the
library, admin functions included.

The library is built with every function's body replaced by ``return 'ran'``, so a
call that the guard lets through does nothing, and loaded on a private redis-server.
Every function gets random calls from its contract: each argument a value that fits it
or one that does not (out of range, empty, one byte too long, a command name, a key
name, bytes that are not UTF-8), counted and repeated groups of random size, a last
group or none, an argument added or dropped, keys of another kind, tag or prefix, a
worker's hash of another id. The guard must refuse exactly what the twin refuses, but
where a Lua pattern is laxer than its regex by design (``attack_fixtures.lua_twin``),
and every refusal must be its ``ERR sq_<name> refused: ...`` reply.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from attack_fixtures import lua_twin
from conftest import start_redis

from streamq.storage.contract import Arg, Contract, ContractError, Counted, KeyKind
from streamq.storage.contracts import CONTRACTS
from streamq.storage.luaload import LuaScript, build_library

CALLS = 150  # per function
_TRACE = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"  # a W3C traceparent

#: values any argument may get: most fit no argument
_ANY = ["", "0", "-1", "1.5", "1e3", " 1", "+1", "9" * 16, "-" + "9" * 15, "SET", "FLUSHALL",
        "sq:{q1}:meta", "a b", "{x}", "x" * 129, "é".encode(), b"\xff\xfe", "1-", "1-2-3",
        "12", "entry:1-2", "entry:1-", "q1~2", "q1~", "+5", "@5", "{}", '{"a":1}', "{",
        "job#3", "job#", "5|cli", "555|cli", "rate|cli|3", "queue", "client:cli", "1.5|10",
        "1|", "j|d", "j|", "|d", "j|a b", "0-0", "1" * 20 + "-1", "1" * 21 + "-1", "r", "p",
        "05|cli", "0|cli", "5|cli:x", _TRACE]
#: parts of keys a kind with a suffix may get
_PARTS = ["worker:w-1", "worker:", "worker:a b", "lane:5:cli", "lane:55:cli", "lane:555:cli",
          "lane:05:cli", "lane:0:cli",
          "lane:5:cli:retry", "lane:5:", "tasks", "announced:j|1|f|2", "announced:",
          "replayed:j|f|1", "replayed-id:1-2", "replayed-id:1-", "meta", "lanes"]
_TAGS = {"job": ["q1/j1"], "queue": ["q1"], "shard": ["q1", "q1~3"],
         "work": ["q1", "q1~3", "q1/j1"]}
_BAD_TAGS = ["q1/j1/x", "", "a b", "q1~", "q2", "q1/j2", "x" * 129]


def _fits(a: Arg) -> list[Any]:
    """Values that fit ``a``, its bounds included."""
    out: list[Any] = [v for v in _ANY if a.ok(v)]
    if a.kind == "int":
        out += [str(a.lo), str(a.hi), str((a.lo + a.hi) // 2)]
    elif a.kind == "enum":
        out += list(a.values)
    elif a.kind in ("name", "intent"):
        out += ["job-1", "x" * 128, "a.b:c_d"]
    elif a.kind == "token":
        out += ["w-1", "t" * a.size, "a/b#1|c~d"]
    elif a.kind == "entry":
        out += ["1700000000000-3", "9" * 20 + "-" + "9" * 20]
    elif a.kind == "text" and a.size <= 4096:
        out += ["t" * a.size, b"\x00\xff"]
    elif a.kind == "text":
        out += ["payload", b"\x00\xff"]
    if a.kind == "text" and a.utf8:
        out += ["boom é ☃ 𝄞\n\"|,\\", "\U0010ffff\ud7ff\ue000", "\x00\x7f\x80\u07ff\u0800"]
    return [v for v in out if a.ok(v)] or [""]


def _misfits(a: Arg) -> list[Any]:
    """Values just past ``a``'s bounds (as many as the rest of ``_ANY``), and ``_ANY``."""
    near: list[Any] = []
    if a.kind == "int":
        near = [str(a.lo - 1), str(a.hi + 1)]
    elif a.kind in ("token", "pattern", "text") and a.size <= 4096:
        near = ["t" * (a.size + 1)]
    elif a.kind == "name":
        near = ["x" * 129]
    if a.kind == "text" and a.utf8:
        # UTF-8 just broken: a surrogate, an overlong form, past U+10FFFF, cut short, a
        # lone continuation byte (each beside characters that are whole)
        near += [b"\xed\xa0\x80", b"a\xc0\xaf", "é".encode() + b"\xf4\x90\x80\x80",
                 "☃".encode()[:2] + b"x", b"\x80" + "𝄞".encode()]
    return near * (len(_ANY) // max(len(near), 1)) + list(_ANY)


class _Calls:
    """Random calls of one function, from its contract."""

    def __init__(self, c: Contract, rng: random.Random) -> None:
        self.c, self.rng = c, rng

    def value(self, a: Arg) -> Any:
        pool = _fits(a) if self.rng.random() < 0.93 else _misfits(a)
        return self.rng.choice(pool)

    def args(self, args: tuple[Any, ...]) -> list[Any]:
        out: list[Any] = []
        for a in args:
            if isinstance(a, Counted):
                n = self.rng.choice([0, 1, 2, 3])
                count = self.rng.choice([str(n)] * 12 + ["x", "-1", str(a.most + 1), str(n + 1)])
                out.append(count)
                if a.most <= 100 and self.rng.random() < 0.1:  # one group more than it takes
                    out[-1] = str(a.most + 1)
                    out += [self.rng.choice(_fits(g)) for _ in range(a.most + 1) for g in a.group]
                    continue
                for _ in range(n):
                    out += self.args(a.group)
            else:
                out.append(self.value(a))
        return out

    def part(self, kind: KeyKind) -> str:
        if not kind.regex or self.rng.random() < 0.05:
            return kind.name if self.rng.random() < 0.97 else self.rng.choice(_PARTS)
        fits = [p for p in _PARTS if kind.part_ok(p)]
        return self.rng.choice(fits if fits and self.rng.random() < 0.93 else _PARTS)

    def call(self) -> tuple[list[Any], list[Any]]:
        c, rng = self.c, self.rng
        args = self.args(c.args)
        groups = rng.choice([c.least, c.least, c.least + 1, c.least + 3, max(c.least - 1, 0)])
        for _ in range(groups if c.rest else 0):
            args += self.args(c.rest)
        if c.tail and rng.random() < 0.5:
            args += self.args(c.tail)
        if rng.random() < 0.04 and args:
            args.pop()
        if rng.random() < 0.04:
            args.append(rng.choice(_ANY))
        tag = rng.choice(_TAGS[c.tag_class])
        keys = [f"sq:{{{tag}}}:{self.part(k)}" for k in c.keys]
        for key_i, at in c.key_of:  # a key named after arguments is theirs, mostly
            if rng.random() < 0.9 and len(args) >= max(at):
                keys[key_i - 1] = (f"sq:{{{tag}}}:{c.keys[key_i - 1].name}:"
                                   + "|".join(_str(args[a - 1]) for a in at))
        for key_i, other in c.retry_of:
            if rng.random() < 0.9:
                keys[key_i - 1] = keys[other - 1] + ":retry"
        for key_i, arg_i in c.lane_binds:  # a lane key is its member's lane, mostly
            if rng.random() < 0.9 and len(args) >= arg_i and isinstance(args[arg_i - 1], str):
                keys[key_i - 1] = f"sq:{{{tag}}}:" + _lane_of(c, key_i, args[arg_i - 1])
        if keys and rng.random() < 0.08:
            i = rng.randrange(len(keys))
            keys[i] = rng.choice([f"sq:{{{rng.choice(_BAD_TAGS)}}}:{c.keys[i].name}",
                                  "FLUSHALL", f"sq:{tag}:{c.keys[i].name}",
                                  f"xq:{{{tag}}}:{c.keys[i].name}"])
        if rng.random() < 0.03:
            keys = keys[:-1] if keys and rng.random() < 0.5 else [*keys, keys[0] if keys else "k"]
        return keys, args


def _str(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _lane_of(c: Contract, key_i: int, member: str) -> str:
    """The key part of ``member``'s lane as KEYS[key_i]'s kind names it (its stream or
    its retry set), written as the member writes its priority."""
    prio, _, client = member.partition("|")
    return f"lane:{prio}:{client}" + (":retry" if c.keys[key_i - 1].name == "lane-retry" else "")


def _passes(c: Contract, keys: list[Any], args: list[Any]) -> bool:
    try:
        c.check(keys, args)
    except (ContractError, UnicodeDecodeError):
        return False
    return True


@pytest.fixture(scope="module")
def guards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    """A private redis-server with every function's guard and no body."""
    proc, url = start_redis(tmp_path_factory.mktemp("guards"))
    scripts = {n: LuaScript(n, c.numkeys, "return 'ran'\n", Path(f"{n}-{c.numkeys}.lua"))
               for n, c in CONTRACTS.items()}
    client = redis.Redis.from_url(url)
    try:
        client.function_load(build_library(scripts, "guards").source)
        yield client
    finally:
        client.close()
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_the_guard_refuses_what_its_contract_refuses(guards: redis.Redis, name: str) -> None:
    # Given a function's contract and random calls of it
    c = CONTRACTS[name]
    made = _Calls(c, random.Random(f"guard:{name}"))
    calls = [made.call() for _ in range(CALLS)]
    # When each is sent to the function, its body a no-op
    pipe = guards.pipeline(transaction=False)
    for keys, args in calls:
        pipe.fcall(f"sq_{name}", len(keys), *keys, *args)
    replies = pipe.execute(raise_on_error=False)
    # Then the guard lets through exactly what the contract's Python twin lets through
    # (but where a Lua pattern is laxer by design), and refuses the rest with its reply
    ran = 0
    for (keys, args), reply in zip(calls, replies):
        lua_ran = reply == b"ran"
        if not lua_ran:
            assert isinstance(reply, redis.ResponseError), reply
            assert str(reply).startswith(f"sq_{name} refused: "), reply
        if lua_ran != _passes(c, keys, args):
            assert lua_ran and _passes(lua_twin(name), keys, args), (
                f"guard {'ran' if lua_ran else 'refused'} {keys} {args}: {reply}")
        ran += lua_ran
    # and the calls were of both kinds
    assert 0 < ran < len(calls), ran


def test_a_key_list_accepted_once_lets_no_other_list_through(guards: redis.Redis) -> None:
    # Given a function whose keys were accepted (the guard keeps accepted key lists)
    paused, wake = "sq:{q1}:paused", "sq:{q1}:wake"
    assert guards.fcall("sq_pause_queue", 2, paused, wake, "p1", 8) == b"ran"
    # When lists near it are sent: the same keys in the other order, the two joined by a
    # NUL (a kept list's joined form) with an empty key, the two split elsewhere, the
    # same keys of another tag
    near = [(wake, paused), (paused + "\0" + wake, ""), (paused, wake + "\0"),
            (paused + wake[:-2], wake[-2:]), ("sq:{q2}:paused", wake)]
    # Then each is refused as before
    for keys in near:
        with pytest.raises(redis.ResponseError, match="sq_pause_queue refused: KEYS"):
            guards.fcall("sq_pause_queue", 2, *keys, "p1", 8)
    # And past the bound of kept lists (4,096: they are forgotten then) every list is
    # judged as before: 5,000 shards accepted, the bad lists still refused
    pipe = guards.pipeline(transaction=False)
    for i in range(5000):
        pipe.fcall("sq_pause_queue", 2, f"sq:{{q{i}}}:paused", f"sq:{{q{i}}}:wake", "p1", 8)
    assert set(pipe.execute()) == {b"ran"}
    for keys in near:
        with pytest.raises(redis.ResponseError, match="sq_pause_queue refused: KEYS"):
            guards.fcall("sq_pause_queue", 2, *keys, "p1", 8)
    assert guards.fcall("sq_pause_queue", 2, paused, wake, "p1", 8) == b"ran"


@pytest.mark.parametrize("name", sorted(n for n, c in CONTRACTS.items() if c.lane_binds))
def test_a_lane_key_is_held_to_the_member_it_is_written_under(
        guards: redis.Redis, name: str) -> None:
    # Given a valid call of a function that names a lane and its member (workers read
    # the lane a member names: a lane written under another would be read by none)
    c = CONTRACTS[name]
    made = _Calls(c, random.Random(f"lane-bind:{name}"))
    keys, args = next(call for call in (made.call() for _ in range(5000))
                      if _passes(c, *call) and "|cli" in str(call[1][c.lane_binds[0][1] - 1]))
    assert guards.fcall(f"sq_{name}", len(keys), *keys, *args) == b"ran"
    member_at = c.lane_binds[0][1] - 1
    prio, client = str(args[member_at]).split("|", 1)
    # When the member names another client's lane, another priority's, or (keys written
    # the same way) the same priority written with a leading zero, or a client name of
    # 129 characters (names have at most 128)
    other = [f"{prio}|other", f"{(int(prio) + 1) % 100}|{client}"]
    calls = [(keys, [*args[:member_at], m, *args[member_at + 1:]]) for m in other]
    tag = str(keys[0]).split("}", 1)[0] + "}:"
    for odd in ([f"0{int(prio)}|{client}"] if int(prio) < 10 else []) + [f"{prio}|{'c' * 129}"]:
        calls.append(([tag + _lane_of(c, k + 1, odd)
                       if any(k + 1 == key_i for key_i, _ in c.lane_binds) else key
                       for k, key in enumerate(keys)],
                      [*args[:member_at], odd, *args[member_at + 1:]]))
    # Then the guard refuses each, and so does the contract's Python twin
    for bad_keys, bad_args in calls:
        with pytest.raises(redis.ResponseError, match=f"sq_{name} refused: KEYS"):
            guards.fcall(f"sq_{name}", len(bad_keys), *bad_keys, *bad_args)
        assert not _passes(c, bad_keys, bad_args), (bad_keys, bad_args)


@pytest.mark.parametrize("name", sorted(n for n, c in CONTRACTS.items()
                                        if c.key_of or c.retry_of))
def test_a_key_named_after_arguments_or_beside_its_lane_is_held_to_them(
        guards: redis.Redis, name: str) -> None:
    # Given a valid call of a function whose key is named after its arguments (a dead
    # letter's marker: the letter it copies) or is a lane's retry set beside that lane
    c = CONTRACTS[name]
    made = _Calls(c, random.Random(f"key-of:{name}"))
    keys, args = next(call for call in (made.call() for _ in range(5000)) if _passes(c, *call))
    assert guards.fcall(f"sq_{name}", len(keys), *keys, *args) == b"ran"
    # When that key names another letter (one argument of its name changed) or the
    # retry set of another lane
    bad: list[list[Any]] = []
    for key_i, _ in c.key_of:
        bad.append([*keys[: key_i - 1], keys[key_i - 1] + "9", *keys[key_i:]])
        bad.append([*keys[: key_i - 1], keys[key_i - 1].rsplit("|", 1)[0] + "|0x",
                    *keys[key_i:]])
    for key_i, other in c.retry_of:
        lane = keys[other - 1]
        bad.append([*keys[: key_i - 1], lane[: lane.rindex(":")] + ":other:retry",
                    *keys[key_i:]])
    # Then the guard refuses each, and so does the contract's Python twin
    for bad_keys in bad:
        with pytest.raises(redis.ResponseError, match=f"sq_{name} refused: KEYS"):
            guards.fcall(f"sq_{name}", len(bad_keys), *bad_keys, *args)
        assert not _passes(c, bad_keys, args), bad_keys


#: values functions once took that their contracts refuse: (function, ARGV position,
#: 1-based or -1 for a call's last, the value): a job's concurrency of 10^9 (finish_jobs
#: builds a table of one entry per unit: Redis stopped for every client), a closer that
#: ends the JSON string it is written into (a small job's record), a trace context with
#: the "|" or "," its retry member is split on, a rate and a limit the Lua pattern let
#: through but no reader parses, a shard suffix of no digit or of nine, an entry field
#: of 25 digits
ONCE_TAKEN = [
    ("finish_jobs", 9, "1000000000"),
    ("lane_cancel", 5, 'x","state":"succeeded","done":1,"z":"'),
    ("lane_cancel", 5, "x\\"),
    ("lane_submit", -1, _TRACE[:20] + "|" + _TRACE[21:]),
    ("lane_submit", -1, _TRACE[:20] + "," + _TRACE[21:]),
    ("lane_submit", -1, _TRACE.upper()),
    ("set_rate", 2, "1.2.3|5"),
    ("set_rate", 1, "nonsense"),
    ("create_job", 1, "qp~"),
    ("create_job", 1, "qp~123456789"),
    ("announced", 1, "entry:" + "1" * 25 + "-1"),
]


@pytest.mark.parametrize(("name", "at", "value"), ONCE_TAKEN)
def test_a_value_its_readers_cannot_take_is_refused(
        guards: redis.Redis, name: str, at: int, value: str) -> None:
    # Given a valid call of the function (the argument at `at` present and not empty)
    c = CONTRACTS[name]
    made = _Calls(c, random.Random(f"once-taken:{name}:{at}"))
    keys, args = next(call for call in (made.call() for _ in range(20000))
                      if _passes(c, *call) and len(call[1]) >= abs(at)
                      and call[1][at if at < 0 else at - 1] not in ("", b"")
                      and (name != "lane_submit" or (len(call[1]) - 5) % 3 == 1))
    assert guards.fcall(f"sq_{name}", len(keys), *keys, *args) == b"ran"
    # When that argument is the value
    bad = list(args)
    bad[at if at < 0 else at - 1] = value
    # Then the guard refuses the call, and so does the contract's Python twin
    with pytest.raises(redis.ResponseError, match=f"sq_{name} refused: ARGV"):
        guards.fcall(f"sq_{name}", len(keys), *keys, *bad)
    assert not _passes(c, keys, bad)
