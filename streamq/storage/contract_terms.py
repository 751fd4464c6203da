"""The terms every script's contract is written in (:mod:`streamq.storage.contracts`):
the kinds of key a script may name (``KINDS``, each of a slot class and a Redis type)
and the types of its arguments, with the arguments many scripts share (a priority, a
lane member, a payload, a failure's error text, the dead stream's cap...).
"""

from __future__ import annotations

from streamq.base.config import DEFAULT_DEAD_MAXLEN, GROUP, MAX_CONCURRENCY, MAX_PRIORITY
from streamq.storage.contract import Arg, KeyKind

NAME_RE = r"[A-Za-z0-9_.:\-]{1,128}"
_TOKEN = r"[!-z|~]{1,300}"


def _kinds(slot: str, rtype: str, names: str) -> dict[str, KeyKind]:
    return {n: KeyKind(n, slot, rtype) for n in names.split()}


#: every kind of key a script may name, by name
KINDS: dict[str, KeyKind] = {
    **_kinds("job", "HASH", "meta results errors inflight dlq batches added ids"),
    **_kinds("job", "STREAM", "tasks"),
    **_kinds("job", "ZSET", "retry"),
    **_kinds("job", "SET", "unannounced"),
    **_kinds("shard", "ZSET", "ready leased parked active finished dedupx creating workers "
             "retries owed lanes lactive ldone"),
    **_kinds("shard", "HASH", "tokens owners kick fair dedup ljobs lresults lerrors lstarts "
             "reaping"),
    **_kinds("shard", "STREAM", "stats events dead lkept"),
    **_kinds("shard", "LIST", "wake"),
    **_kinds("shard", "STRING", "paused reaper-lock"),
    **_kinds("queue", "HASH", "rates buckets repeats"),
    **_kinds("queue", "ZSET", "repeat-next repeat-last"),
    "worker": KeyKind("worker", "shard", "HASH", r"worker:" + _TOKEN,
                      "^worker:[!-z|~]+$", "worker:<id>"),
    "lane": KeyKind("lane", "shard", "STREAM", r"lane:[0-9]{1,2}:" + NAME_RE,
                    "^lane:%d%d?:[%w_%.:%-]+$", "lane:<prio>:<client>", never_ends=":retry"),
    "lane-retry": KeyKind("lane-retry", "shard", "ZSET", r"lane:[0-9]{1,2}:" + NAME_RE + ":retry",
                          "^lane:%d%d?:[%w_%.:%-]+:retry$", "lane:<prio>:<client>:retry"),
    "work": KeyKind("work", "shard", "STREAM", r"lane:[0-9]{1,2}:" + NAME_RE,
                    "^lane:%d%d?:[%w_%.:%-]+$", "tasks|lane:<prio>:<client>", exact="tasks",
                    never_ends=":retry"),
    "announced": KeyKind("announced", "shard", "STRING", r"announced:" + _TOKEN,
                         "^announced:[!-z|~]+$", "announced:<job>|<created>|<field>|<serial>"),
    "replayed": KeyKind("replayed", "shard", "STRING", r"replayed:" + _TOKEN,
                        "^replayed:[!-z|~]+$", "replayed:<job>|<created>|<field>|<serial>"),
    "replayed-id": KeyKind("replayed-id", "shard", "STRING", r"replayed-id:[0-9]{1,20}-[0-9]{1,20}",
                           "^replayed%-id:%d+%-%d+$", "replayed-id:<entry id>"),
}

_MS = 10**13  # every duration or time in ms is below this (about 317 years)
COUNT_MAX = 10**9  # counts and caps
BIG = 512 * 1024 * 1024  # Redis's largest bulk string: payloads and results
_TEXT = 1024 * 1024  # error texts (a traceback), records


def keys(names: str) -> tuple[KeyKind, ...]:
    return tuple(KINDS[n] for n in names.split())


def i(name: str, lo: int = 0, hi: int = COUNT_MAX, *, empty: bool = False) -> Arg:
    return Arg(name, "int", lo=lo, hi=hi, empty=empty)


def ms(name: str, *, empty: bool = False, lo: int = 0) -> Arg:
    return Arg(name, "int", lo=lo, hi=_MS, empty=empty)


def name(n: str, *, empty: bool = False) -> Arg:
    return Arg(n, "name", empty=empty)


def tok(n: str, *, empty: bool = False, size: int = 300) -> Arg:
    return Arg(n, "token", size=size, empty=empty)


def text(n: str, size: int = _TEXT, *, utf8: bool = False) -> Arg:
    return Arg(n, "text", size=size, utf8=utf8)


def enum(n: str, *values: str) -> Arg:
    return Arg(n, "enum", values=values)


def pat(n: str, regex: str, lua: str, doc: str, size: int = 300, *, empty: bool = False) -> Arg:
    return Arg(n, "pattern", regex=regex, lua=lua, doc=doc, size=size, empty=empty)


GROUP_ARG = enum("group", GROUP)
SHARD = pat("queue", NAME_RE + r"(?:~[0-9]{1,4})?", "^[%w_%.:%-]+$\n^[%w_%.:%-]+~%d%d?%d?%d?$",
            "<queue>[~<n>]", 140)
ENTRY = Arg("entry id", "entry")
KIND = enum("payload type", "b", "s", "j")
#: the type letter a failure carries: a malformed entry's own, whatever it was
FAILED_KIND = text("payload type", 16)
PAYLOAD = text("payload", BIG)
#: a W3C traceparent (version, trace id, parent id, flags: lowercase hex): kept in a
#: small job's retry member between "," and "|", so neither may be in it
TRACE = pat("trace context", r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}",
            "^[%da-f][%da-f]%-" + "[%da-f]" * 32 + "%-" + "[%da-f]" * 16 + "%-[%da-f][%da-f]$",
            "<traceparent>", 55, empty=True)
PRIORITY = i("priority", 0, MAX_PRIORITY)
CONCURRENCY = i("concurrency", 1, MAX_CONCURRENCY)
WAKE_CAP = i("cap on wake-up signals", 0, 100_000)
TOKEN = pat("token", NAME_RE + r"#[0-9]{1,5}", "^[%w_%.:%-]+#%d+$", "<job>#<n>", 140)
LANE_MEMBER = pat("lane member", r"[0-9]{1,2}\|" + NAME_RE, "^%d%d?|[%w_%.:%-]+$", "<prio>|<client>",
                  132)
JSON = pat("JSON record", r"\{.*\}", "^{.*}$", "{...}", _TEXT)
_D20 = "%d" + "%d?" * 19  # 1 to 20 digits (Lua patterns have no {1,20})
D12, D9 = "%d" + "%d?" * 11, "%d" + "%d?" * 8
FIELD = pat("field", r"-?[0-9]{1,15}|entry:[0-9]{1,20}-[0-9]{1,20}",
            "^%-?%d%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?$\n^entry:" + _D20 + "%-" + _D20 + "$",
            "<index> or entry:<id>", 60)
#: a shard's dead stream cap (XADD MAXLEN ~): the deployment's (a smaller one trims others')
DEAD_CAP = i("dead stream cap", DEFAULT_DEAD_MAXLEN)
#: a failure's error text, kept where its readers decode UTF-8 (status, announce, retry)
ERROR = text("error", utf8=True)
#: what every lane script that completes jobs is told (channels come from its tag)
LANE_CTX = (GROUP_ARG, i("events cap"), ms("events retention"))
