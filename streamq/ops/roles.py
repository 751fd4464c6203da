"""The Redis ACL roles of a streamq deployment, and the ACL rules each gets.

With streamq's Redis module loaded (``module/streamq_module.c``, the shipped
``deploy/users.acl``), a role holds no write command of its own: it may call its
own functions through the module's SQ.FCALL (``+sq.fcall|sq_<name>``), which runs
them with the module's rights, not the caller's; it reads ``sq:`` keys, and the
few writes it sends itself are each limited by an ACL selector to the one kind
of key they need (a queue's shard list, the registry of queue names, and for a
worker its reads of work streams, its lease freshness and its wake list). Raw
writes to streamq's state, PUBLISH, and every kind of code are refused.

Without the module (``deploy/users-plain.acl``, for servers that cannot load
one), each role may call its own functions of streamq's library (``+fcall|sq_<name>``,
a first-argument rule Redis 7.0 accepts for FCALL) and no other code: EVAL,
EVALSHA, SCRIPT and FUNCTION are the admin's. Redis runs a function's commands
with the caller's permissions, so a role also holds the commands its functions
run (read from their Lua here, never listed by hand) plus the few it sends
itself (reads, XREADGROUP, pub/sub). It may read every ``sq:`` key and write
only the kinds of key its functions name in KEYS (read from their headers).
``streamq setup --acl`` prints these rules as ACL file lines;
``deploy/users.acl`` is that output. The admin has every right: setup, dead-letter
replay and purge, pause, resume, re-prioritize and rate limits run as it.
"""

from __future__ import annotations

import functools
import hashlib
import re

from streamq.storage.contract import KeyKind
from streamq.storage.contracts import CONTRACTS
from streamq.storage.luaload import TIME_FUNCTION, VERSION_FUNCTION, bundled, function_name

__all__ = ["DIRECT", "FUNCTIONS", "ROLES", "SCOPED", "acl_line", "acl_rules", "commands_of",
           "keys_of", "write_keys"]

ROLES = ("producer", "worker", "reaper", "inspector", "admin")

#: The scripts each runtime role runs (as functions): its operations, as each
#: script's declared contract names them (:mod:`streamq.contracts`).
FUNCTIONS: dict[str, frozenset[str]] = {
    role: frozenset(c.name for c in CONTRACTS.values() if role in c.roles)
    for role in ("producer", "worker", "reaper", "inspector")
}

#: Commands each role sends itself, outside functions.
_READS = ("get", "hget", "hmget", "hgetall", "hexists", "hlen", "hscan", "exists", "type",
          "ttl", "pttl", "xlen", "xrange", "xrevrange", "xpending", "xinfo|groups",
          "xinfo|consumers", "xinfo|stream", "zcard", "zcount", "zrange", "zrangebyscore",
          "zrevrangebyscore", "zscore", "zscan", "scard", "smembers", "sscan", "llen")
_CONNECT = ("ping", "hello", "auth", "time", "command", "readonly", "asking", "cluster|slots",
            "cluster|shards", "cluster|nodes", "cluster|info", "wait")
_SUBSCRIBE = ("subscribe", "unsubscribe", "ssubscribe", "sunsubscribe")
DIRECT: dict[str, tuple[str, ...]] = {
    # status, results, wait, subscribe; a queue's first use stores its shards
    "producer": (*_CONNECT, *_READS, *_SUBSCRIBE, "hsetnx", "sadd"),
    # reads of its work, its wake list, its leases (XCLAIM JUSTID), the eviction check
    "worker": (*_CONNECT, *_READS, "hsetnx", "sadd", "xreadgroup", "blpop", "rpop", "xclaim",
               "info"),
    "reaper": (*_CONNECT, *_READS, "hsetnx", "sadd"),
    "inspector": (*_CONNECT, *_READS, *_SUBSCRIBE),
}

#: Keys a role writes itself, outside functions (besides those its functions name):
#: a queue's first use stores its shards in its config hash, and a process that loads
#: them adds the queue's name to the registry of queues.
_DIRECT_WRITES: dict[str, tuple[str, ...]] = {
    "producer": ("sq:{*}:config", "sq:queues"),
    "worker": ("sq:{*}:config", "sq:queues"),
    "reaper": ("sq:{*}:config", "sq:queues"),
    "inspector": (),
}

#: The writes a role sends itself, and the only keys each may touch: with the module,
#: each is an ACL selector of its own (``(~<keys> +<command>)``), so a role writes
#: nothing else outside its functions.
SCOPED: dict[str, tuple[str, ...]] = {
    "hsetnx": ("sq:{*}:config",),  # a queue's first use stores its shards
    "sadd": ("sq:queues",),  # the registry of queue names
    "xreadgroup": ("sq:{*}:tasks", "sq:{*}:lane:*:*"),  # a worker reads its work
    "xclaim": ("sq:{*}:tasks", "sq:{*}:lane:*:*"),  # ... and keeps it fresh (JUSTID)
    "blpop": ("sq:{*}:wake",),  # an idle worker waits for a wake-up signal
    "rpop": ("sq:{*}:wake",),  # ... and drops the stale ones (streamq.work.idle_wait)
}

_CALL_RE = re.compile(r"""\b(?:rcall|redis\.call|redis\.pcall)\(\s*["']([A-Za-z]+)["']"""
                      r"""(?:\s*,\s*["']([A-Za-z]+)["'])?""")
_PCALL_RE = re.compile(r"""\bpcall\(\s*rcall\s*,\s*["']([A-Za-z]+)["']"""
                       r"""(?:\s*,\s*["']([A-Za-z]+)["'])?""")
#: Commands whose first argument is a subcommand (ACL rules name them ``cmd|sub``).
_CONTAINERS = frozenset({"xgroup", "xinfo"})


@functools.cache
def commands_of(script: str) -> frozenset[str]:
    """The Redis commands the script ``script`` (with its includes) can run, as ACL
    names. A function that publishes (its contract says so) runs PUBLISH or SPUBLISH,
    chosen inside from the server's INFO (lua/library/guard.lua)."""
    source = bundled()[script].source
    found: set[str] = set()
    for regex in (_CALL_RE, _PCALL_RE):
        for cmd, sub in regex.findall(source):
            cmd = cmd.lower()
            found.add(f"{cmd}|{sub.lower()}" if cmd in _CONTAINERS and sub else cmd)
    if CONTRACTS[script].publishes:
        found |= {"publish", "spublish", "info"}
    return frozenset(found)


def _acl_patterns(kind: KeyKind) -> list[str]:
    """The ACL key patterns of one kind of key (``worker:<id>`` is ``worker:*``)."""
    shown = kind.pattern.split("|", 1)[1] if kind.exact else kind.pattern
    return [*([kind.exact] if kind.exact else []), re.sub(r"<[^>]*>", "*", shown)]


@functools.cache
def keys_of(script: str) -> frozenset[str]:
    """The key patterns of a script's KEYS, from its declared contract
    (``sq:{<job>}:meta`` is ``sq:{*}:meta``): every key a script touches is one of
    its KEYS."""
    return frozenset(f"sq:{{*}}:{p}" for k in CONTRACTS[script].keys for p in _acl_patterns(k))


def write_keys(role: str) -> list[str]:
    """The key patterns ``role`` may write: the KEYS of its functions (FCALL needs
    write access to every key it names) and the keys it writes itself."""
    found = set(_DIRECT_WRITES[role])
    for script in FUNCTIONS[role]:
        found |= keys_of(script)
    return sorted(found)


def acl_rules(role: str, module: bool = True) -> str:
    """The ACL rules of ``role`` (after ``user <name> on <password>``), for a server
    with streamq's module loaded (``module``) or without it."""
    if role == "admin":
        return "~* &* +@all"
    if role not in FUNCTIONS:
        raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    scripts = sorted(FUNCTIONS[role])
    read_only = [f"+fcall_ro|{VERSION_FUNCTION}", f"+fcall_ro|{TIME_FUNCTION}"]
    if module:
        # SQ.FCALL declares its keys with no access flags, which Redis checks as full
        # access: the root pattern grants it, and the root has no other write command
        plain = [f"+{c}" for c in sorted(set(DIRECT[role]) - set(SCOPED))]
        calls = [f"+sq.fcall|{function_name(s)}" for s in scripts]
        by_scope: dict[tuple[str, ...], list[str]] = {}
        for c in DIRECT[role]:
            if c in SCOPED:
                by_scope.setdefault(SCOPED[c], []).append(c)
        scoped = [f"({' '.join(f'~{k}' for k in scope)} {' '.join(f'+{c}' for c in cs)})"
                  for scope, cs in by_scope.items()]
        keys = ["~sq:*"] if scripts else ["%R~sq:*"]
        return " ".join(["resetkeys", *keys, "resetchannels", "&sq:*", "-@all",
                         *plain, *calls, *read_only, *scoped])
    commands = set(DIRECT[role])
    for script in scripts:
        commands |= commands_of(script)
    calls = [f"+fcall|{function_name(s)}" for s in scripts]
    plain = [f"+{c}" for c in sorted(commands)]
    # every role may read streamq's keys and write only the kinds of key its own
    # operations write (Redis 7.0 key permissions: %R~ read only, ~ read and write: one
    # pattern must grant all a command needs, FCALL needs both); the inspector
    # writes none, whatever its command list says
    keys = ["%R~sq:*", *(f"~{k}" for k in write_keys(role))]
    return " ".join(["resetkeys", *keys, "resetchannels", "&sq:*", "-@all",
                     *plain, *calls, *read_only])


def acl_line(role: str, password: str, module: bool = True) -> str:
    """One ACL file line for ``role``, its password stored as a SHA-256 hash."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    return f"user {role} on #{digest} {acl_rules(role, module)}"
