"""The harness of the attack suite (tests/system/test_attacks.py).

- :func:`standalone_arena` / :func:`cluster_arena`: a server (or a Redis Cluster) with
  streamq's library, the runtime roles' ACL users (:func:`streamq.roles.acl_line`), a
  victim queue and an attacker queue with real state (:func:`build_side`), and keys
  outside ``sq:`` in db 0 and db 1;
- :class:`Maker`: a valid call of a function, built from its declared contract
  (:mod:`streamq.contracts`) for the attacker's tags, and its mutations;
- :class:`Watch`: what tells a change of anything but the attacker's keys: the server's
  keyspace notifications and channel messages, read after every call (a PING on the
  subscribed connection is the barrier), and a snapshot of every watched key (type,
  content, expiry time) compared before and after;
- :func:`attack`: N mutated calls of every function of a role, counted.

Names: the victim's queue is ``victim``; every other tag (the victim's jobs, the
attacker's queue and jobs) is brute-forced to hash to the same cluster slot, so on a
cluster a cross-tag call is stopped by the guard, never by CROSSSLOT. Every key of the
attacker starts ``sq:{atk``; every other key is watched.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from streamq import Queue, Worker
from streamq.base.config import GROUP
from streamq.base.keys import JobKeys, QueueKeys
from streamq.ops.roles import acl_line
from streamq.storage import functions
from streamq.storage.contract import Arg, Contract, ContractError, Counted, KeyKind
from streamq.storage.contracts import CONTRACTS, KINDS

RUNTIME_ROLES = ("producer", "worker", "reaper", "inspector")
PASSWORDS = {role: f"{role}-attack-secret" for role in RUNTIME_ROLES}

VICTIM_QUEUE = "victim"
#: the slot of every tag of the suite (the victim queue's)
SLOT = key_slot(VICTIM_QUEUE.encode())
ATTACKER_PREFIX = "atk"


@functools.cache
def same_slot(prefix: str, n: int, queue: str = "") -> tuple[str, ...]:
    """The first ``n`` names ``<prefix><i>`` whose cluster slot (as a hash tag) is SLOT;
    with ``queue``, job ids whose job tag ``<queue>/<id>`` is."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        name = f"{prefix}{i}"
        if key_slot((f"{queue}/{name}" if queue else name).encode()) == SLOT:
            out.append(name)
        i += 1
    return tuple(out)


#: the victim's jobs: dead letters, queued multi-entry, open (streaming), scheduled
VICTIM_JOBS = same_slot("victim-job-", 4, VICTIM_QUEUE)
ATTACKER_QUEUE = same_slot("atk-q", 1)[0]
ATTACKER_JOBS = same_slot("atk-job-", 4, ATTACKER_QUEUE)
#: fresh job ids of the attacker, for creates
ATTACKER_NEW = same_slot("atk-new-", 6, ATTACKER_QUEUE)
ATTACKER_WORKER = "atk-w1"

#: keys outside streamq's, written before the attack: db 0 (on a cluster: ``foo`` in
#: another slot, the others in the suite's slot) and db 1 (standalone)
OUTSIDE_DB0 = ("foo", "victim", "{victim}:h", "{victim}:ttl", "sq:victim:meta")
OUTSIDE_DB1 = ("foo", "victim")

_TAG_RE = re.compile(rb"sq:\{([^{}]*)\}:")
_CHANNEL_RE = re.compile(rb"__keyspace@(\d+)__:(.*)", re.DOTALL)
MIB = b"A" * (1 << 20)


def is_attacker_key(key: bytes) -> bool:
    m = _TAG_RE.match(key)
    return m is not None and m[1].startswith(ATTACKER_PREFIX.encode())


def now_ms() -> int:
    return int(time.time() * 1000)


# -- servers ------------------------------------------------------------------------------

def set_users(client: redis.Redis, module: bool) -> None:
    """The runtime roles as :func:`streamq.roles.acl_line` writes them (ACL SETUSER, rule
    for rule; Redis merges a selector's words back into one)."""
    for role in RUNTIME_ROLES:
        _, name, *rules = acl_line(role, PASSWORDS[role], module=module).split()
        client.execute_command("ACL", "SETUSER", name, "reset", *rules)


def fail_boom(payload: Any) -> Any:
    """A handler failing every payload that starts with ``boom``."""
    if isinstance(payload, str) and payload.startswith("boom"):
        raise RuntimeError("boom")
    return payload


def build_side(url: str, queue: str, jobs: Sequence[str], *, run_worker: bool,
               pause: bool) -> None:
    """A queue with real state, made with streamq's own API (as the admin): with
    ``run_worker``, a job of three entries two of which are dead-lettered and lane jobs
    (one dead-lettered) run by a worker that then stops; then a queued job of six
    entries, an open streaming job, a job scheduled an hour ahead, a queued lane job,
    rate limits, and (``pause``) a pause."""
    dead_id, multi_id, open_id, sched_id = jobs
    q = Queue(queue, url, shards=1)
    try:
        done = [q.submit(["boom-1", "boom-2", "fine"], job_id=dead_id, max_deliveries=1),
                q.submit(["fine-small"]), q.submit(["boom-lane"], max_deliveries=1)]
        if run_worker:
            w = Worker(queue, fail_boom, url, shards=1, concurrency=2, heartbeat_s=0.2,
                       idle_wait_s=0.1)
            t = threading.Thread(target=w.run, daemon=True)
            t.start()
            try:
                for job in done:
                    job.wait(timeout=30)
            finally:
                w.stop()
                t.join(30)
            assert not t.is_alive(), "the worker did not stop"
        q.submit([f"item-{i}" for i in range(6)], job_id=multi_id, concurrency=2,
                 max_deliveries=3)
        sj = q.open(job_id=open_id, concurrency=2)
        sj.add("streamed-1")
        sj.add({"streamed": 2})
        q.submit(["later"], job_id=sched_id, delay=3600)
        q.submit(["lane-pending"])
        q.set_rate(50.0)
        q.set_rate(5.0, client="default")
        if pause:
            q.pause(wait=False)
    finally:
        q.close()


def write_outside(db0: Any, db1: redis.Redis | None) -> None:
    db0.set("foo", "bar")
    db0.rpush("victim", "a", "b", "c")
    db0.hset("{victim}:h", mapping={"f": "v", "g": "w"})
    db0.set("{victim}:ttl", "x", ex=3600)
    db0.set("sq:victim:meta", "not a streamq key")
    if db1 is not None:
        db1.set("foo", "db1")
        db1.hset("victim", mapping={"in": "db1"})


@dataclass
class Attacker:
    """What valid calls of the attacker name: its queue, jobs, entries, lane, letters."""

    queue: str = ATTACKER_QUEUE
    jobs: tuple[str, ...] = ATTACKER_JOBS
    new: tuple[str, ...] = ATTACKER_NEW
    worker: str = ATTACKER_WORKER
    entries: dict[str, list[str]] = field(default_factory=dict)
    created: dict[str, int] = field(default_factory=dict)
    incarnation: dict[str, str] = field(default_factory=dict)
    lane_prio: int = 50
    lane_client: str = "default"
    lane_entries: list[str] = field(default_factory=list)
    lane_jobs: list[str] = field(default_factory=list)
    letters: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, admin: redis.Redis) -> Attacker:
        a = cls()
        for job in a.jobs:
            jk = JobKeys(job, a.queue)
            a.entries[job] = [i.decode() for i, _ in admin.xrange(jk.tasks)]
            meta = admin.hgetall(jk.meta)
            a.created[job] = int(meta.get(b"created", b"0") or 0)
            a.incarnation[job] = (meta.get(b"incarnation") or b"inc").decode()
        qk = QueueKeys(a.queue)
        lane_key = qk.lane(a.lane_prio, a.lane_client)
        a.lane_entries = [i.decode() for i, _ in admin.xrange(lane_key)]
        a.lane_jobs = sorted(j.decode() for j in admin.hkeys(qk.ljobs))
        prefix = f"sq:{{{a.queue}}}:announced:"
        a.letters = sorted(k.decode()[len(prefix):] for k in admin.scan_iter(prefix + "*"))
        return a


@dataclass
class Arena:
    """One setup under attack."""

    name: str  # module | plain | cluster
    command: str  # SQ.FCALL | FCALL
    host: str
    port: int
    #: the default user (the admin) on the node every call goes to
    admin: redis.Redis
    #: (label, client, every key is watched): db 0 of every node, db 1 of a standalone one
    watched: list[tuple[str, redis.Redis, bool]]
    attacker: Attacker
    victim_channels: list[str]
    stop: Callable[[], None]
    counts: dict[str, Any] = field(default_factory=dict)

    def client(self, role: str, **kw: Any) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, username=role,
                           password=PASSWORDS[role], socket_timeout=30, **kw)

    def run_id(self) -> str:
        return str(self.admin.info("server")["run_id"])


def prepare(name: str, url: str, admin: redis.Redis, db0: Any, db1: redis.Redis | None,
            lib: Any = None) -> tuple[Attacker, list[str]]:
    """State of both sides (the library loaded first), the outside keys (``db0``: a
    client of db 0, a RedisCluster on a cluster), keyspace notifications on, and the
    attacker's context. ``lib``: another library loaded last (the self-test's unguarded
    one: the state is made by streamq's own guarded calls)."""
    functions.load(db0)
    run_worker = name != "selftest"
    build_side(url, VICTIM_QUEUE, VICTIM_JOBS, run_worker=run_worker, pause=True)
    build_side(url, ATTACKER_QUEUE, ATTACKER_JOBS, run_worker=run_worker, pause=False)
    write_outside(db0, db1)
    if lib is not None:
        admin.function_load(lib.source, replace=True)
    admin.config_set("notify-keyspace-events", "KA")
    qk = QueueKeys(VICTIM_QUEUE)
    channels = [qk.channel, *(qk.job_channel(j) for j in VICTIM_JOBS)]
    return Attacker.read(admin), channels


# -- calls --------------------------------------------------------------------------------

_INTS = {
    "priority": 50, "concurrency": 2, "max deliveries": 3, "retention": 86_400_000,
    "lease length": 30_000, "heartbeat lifetime": 15_000, "description lifetime": 60_000,
    "worker hash lifetime": 60_000, "stats window": 3_900_000, "min idle": 0, "count": 10,
    "most": 10, "cap on wake-up signals": 1000, "events cap": 10_000,
    "events retention": 86_400_000, "dead stream cap": 100_000, "attempts": 1,
    "retry delay": 500, "index": 0, "serial": 1, "marker lifetime": 600_000, "delay": 1000,
    "total": 2, "done": 1, "failed": 1, "dead": 1, "permits": 1, "claim": 2,
    "most due jobs": 5, "most tokens": 10, "batch id": 1, "produced": 1, "partition": 0,
    "lifetime": 60_000, "timeout": 0, "attempt": 1, "max deliveries override": 0,
}

#: what replaces an argument: command names, key names, numbers out of every range,
#: what is not a number, nothing, a megabyte (and one byte more)
HOSTILE_WORDS = ("SET", "DEL", "EXPIRE", "RENAME", "LPUSH", "SWAPDB", "FLUSHALL", "SQ.FCALL",
                 "FCALL", "EVAL", "foo", "victim")
HOSTILE_NUMBERS = ("-1", "-999999999999999", str(10**30), str(-(10**30)), "abc", "1.5", "",
                   "1e3", " 1", "0x10", "nan", "inf", "0", "99999999999999999999-0",
                   "18446744073709551616-0")
HOSTILE_TEXTS = ("a b", "{victim}", "\x00", "é", "sq:{victim}:meta", "%s", "]]--")


def hostile_values(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.04:
        return MIB
    if roll < 0.08:
        return MIB + b"A"
    vjob = rng.choice(VICTIM_JOBS)
    pool = [*HOSTILE_WORDS, *HOSTILE_NUMBERS, *HOSTILE_TEXTS,
            f"sq:{{{VICTIM_QUEUE}}}:meta", f"sq:{{{VICTIM_QUEUE}/{vjob}}}:meta", vjob, VICTIM_QUEUE,
            f"{vjob}#0", f"50|{VICTIM_QUEUE}", f"{VICTIM_QUEUE}~1", f"{vjob}|1|0|1"]
    return rng.choice(pool)


@dataclass
class Call:
    function: str
    numkeys: Any
    keys: list[Any]
    args: list[Any]
    label: str = "valid"

    def command(self, word: str) -> list[Any]:
        return [word, f"sq_{self.function}", self.numkeys, *self.keys, *self.args]

    def short(self) -> str:
        def cut(v: Any) -> str:
            s = v.decode("latin-1") if isinstance(v, bytes) else str(v)
            return s if len(s) <= 60 else f"{s[:20]}...<{len(s)} bytes>"
        return (f"[{self.label}] sq_{self.function} {cut(self.numkeys)} "
                + " ".join(repr(cut(x)) for x in [*self.keys, *self.args]))


class Maker:
    """Valid calls of a function, from its contract, for the attacker's tags; and their
    mutations."""

    def __init__(self, rng: random.Random, atk: Attacker) -> None:
        self.rng = rng
        self.atk = atk

    # -- valid values --

    def token(self, prefix: str) -> str:
        return f"{prefix}-{self.rng.getrandbits(32):08x}"

    def value(self, a: Arg, c: Contract, job: str) -> Any:
        rng, atk, n = self.rng, self.atk, a.name
        if a.empty and a.kind not in ("text", "enum") and rng.random() < 0.2:
            return ""
        is_lane = c.name.startswith("lane_")
        if a.kind == "int":
            if n in ("time", "due"):
                v = now_ms()
            elif n == "job created":
                v = atk.created.get(job, now_ms())
            elif n in ("expected total", "intent time"):
                return "" if a.empty else a.lo
            else:
                v = _INTS.get(n, 1)
            return str(min(max(v, a.lo), a.hi))
        if a.kind == "enum":
            if n == "group":
                return GROUP
            if n == "payload type":
                return "s"
            if n == "mode" and c.name == "settle":
                return rng.choice(["r", "p", "d"])
            return rng.choice([v for v in a.values if v])
        if a.kind == "name":
            if n == "client":
                return atk.lane_client
            if c.tag_class != "job" and is_lane and atk.lane_jobs:
                return rng.choice(atk.lane_jobs)
            return job
        if a.kind == "token":
            if n == "worker id":
                return atk.worker
            if n in ("owner", "consumer"):
                return f"{atk.worker}/0"
            if n == "incarnation":
                return atk.incarnation.get(job) or self.token("inc")
            if n == "stat":
                return "succeeded"
            if n == "field":
                return "host"
            if n == "trace context":
                return f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-01"
            if n == "stats batch":
                return ""
            return self.token(n.replace(" ", "-"))
        if a.kind == "entry":
            if n == "cursor":
                return "0-0"
            pool = atk.lane_entries if is_lane else atk.entries.get(job, [])
            return rng.choice(pool) if pool else "1-0"
        if a.kind == "text":
            return {"payload": "hello", "error": "boom", "reason": "why",
                    "result": '"ok"', "value": "v"}.get(n, "text")
        # patterns
        if n == "queue":
            return atk.queue
        if n == "when":
            return rng.choice(["", "+1000"])
        if n == "score":
            return str(now_ms())
        if n == "intent":
            return job
        if n == "job":  # schedule_retry: a job, or a rate-limit wait of one
            return rng.choice([job, f"rate|{job}|1"])
        if n == "lane member":
            return f"{atk.lane_prio}|{atk.lane_client}"
        if n == "new lane member":  # (its keys are made from it: valid's lane binds)
            return f"{rng.choice([atk.lane_prio, 7])}|{atk.lane_client}"
        if n == "JSON record":
            return json.dumps({"job_id": job, "state": "succeeded", "total": 2})
        if n == "field":
            return rng.choice(["0", "1"])
        if n == "token":
            return f"{job}#0"
        if n == "limit":
            return "queue"
        if n == "rate":
            return "10|10"
        if n == "trace context":  # a W3C traceparent, or none
            return rng.choice(["", "00-" + "4bf92f3577b34da6a3ce929d0e0e4736"
                               + "-00f067aa0ba902b7-01"])
        if n == "spec":
            return json.dumps({"name": job, "payloads": ["x"], "every": 60})
        raise AssertionError(f"no valid value for {c.name}'s {n!r} ({a.kind})")

    def args(self, c: Contract, job: str) -> list[Any]:
        out: list[Any] = []
        for a in c.args:
            if isinstance(a, Counted):
                out.append("1")
                out.extend(self.value(g, c, job) for g in a.group)
            else:
                out.append(self.value(a, c, job))
        if c.rest:
            for _ in range(max(c.least, self.rng.choice([1, 1, 2]))):
                out.extend(self.value(g, c, job) for g in c.rest)
        if c.tail and self.rng.random() < 0.5:
            out.extend(self.value(g, c, job) for g in c.tail)
        return out

    # -- keys --

    def part(self, kind: KeyKind) -> str:
        atk = self.atk
        if not kind.regex:
            return kind.name
        if getattr(kind, "exact", "") and self.rng.random() < 0.5:
            return str(kind.exact)  # a kind of two shapes: its exact part, or its suffix's
        if kind.name == "worker":
            return f"worker:{atk.worker}"
        if kind.name in ("lane", "work") or kind.regex.startswith("lane:[0-9]{1,2}:") and \
                not kind.regex.endswith(":retry"):
            return f"lane:{atk.lane_prio}:{atk.lane_client}"
        if kind.name == "lane-retry":
            return f"lane:{atk.lane_prio}:{atk.lane_client}:retry"
        if kind.name == "announced":
            letter = (self.rng.choice(atk.letters) if atk.letters
                      else f"{atk.jobs[0]}|{atk.created.get(atk.jobs[0], 1)}|0|1")
            return f"announced:{letter}"
        if kind.name == "replayed":
            return f"replayed:{atk.jobs[0]}|0|1"
        if kind.name == "replayed-id":
            return "replayed-id:1-0"
        raise AssertionError(kind.name)

    def tag(self, c: Contract, job: str) -> str:
        return f"{self.atk.queue}/{job}" if c.tag_class == "job" else self.atk.queue

    def job(self, c: Contract) -> str:
        if c.name == "create_job":
            return self.rng.choice([*self.atk.new, *self.atk.jobs])
        return self.rng.choice(self.atk.jobs)

    def valid(self, name: str, job: str | None = None) -> Call:
        c = CONTRACTS[name]
        job = job or self.job(c)
        tag = self.tag(c, job)
        args = self.args(c, job)
        keys = [f"sq:{{{tag}}}:{self.part(k)}" for k in c.keys]
        exact = getattr(c.keys[0], "exact", "")
        if len(keys) == 1 and exact in KINDS and KINDS[exact].slot == "job" and \
                keys[0].endswith(":" + exact):
            keys = [f"sq:{{{self.atk.queue}/{job}}}:{exact}"]  # a job's part: its tag
        for key_i, at in c.key_of:  # a key named after the call's arguments
            keys[key_i - 1] = (f"sq:{{{tag}}}:{c.keys[key_i - 1].name}:"
                               + "|".join(str(args[a - 1]) for a in at))
        for key_i, other in c.retry_of:
            keys[key_i - 1] = keys[other - 1] + ":retry"
        for key_i, at in c.lane_binds:  # a lane (or its retry set) of a member argument
            prio, client = str(args[at - 1]).split("|", 1)
            keys[key_i - 1] = (f"sq:{{{tag}}}:lane:{prio}:{client}"
                               + (":retry" if c.keys[key_i - 1].name == "lane-retry" else ""))
        c.check(keys, args)  # the generator makes only what the contract accepts
        return Call(name, len(keys), keys, args)

    # -- mutations --

    def victim_tag(self, c: Contract) -> str:
        """A tag of the victim's for the call's class: a job of the victim's, or the victim's
        queue (or a victim's job id: a shard's tag is any name)."""
        if c.tag_class == "job":
            return f"{VICTIM_QUEUE}/{self.rng.choice(VICTIM_JOBS)}"
        if c.tag_class == "work":
            return self.rng.choice([VICTIM_QUEUE, f"{VICTIM_QUEUE}/{VICTIM_JOBS[0]}"])
        return self.rng.choice([VICTIM_QUEUE, VICTIM_QUEUE, *VICTIM_JOBS])

    def mutate_keys(self, call: Call, c: Contract) -> str:
        rng, keys = self.rng, call.keys
        i = rng.randrange(len(keys))
        how = rng.choice(["victim", "victim", "victim", "kind", "outside", "badtag", "suffix"])
        if how == "victim" and len(keys) == 1:
            # all of one call's keys of the victim's tag is a valid call: a role may run
            # its functions on any queue and job; one key of another tag is the attack
            # (so no valid tag of the victim's, not even its shard victim~1, is a bad tag)
            how = "outside"
        if how == "victim":
            vtag = self.victim_tag(c)
            shape = rng.choice(["tail", "head", "one", "some"])
            if shape == "tail":  # the attacker's first key, then the victim's
                idx = list(range(1, len(keys)))
            elif shape == "head":
                idx = [0]
            elif shape == "one":
                idx = [i]
            else:
                idx = rng.sample(range(len(keys)), rng.randrange(1, len(keys)))
            for j in idx:
                keys[j] = f"sq:{{{vtag}}}:{self.part(c.keys[j])}"
            return f"KEYS{[j + 1 for j in sorted(idx)]}:victim"
        if how == "kind":
            kind = rng.choice([k for k in KINDS.values() if k.name != c.keys[i].name])
            keys[i] = f"sq:{{{self.tag(c, self._tag_job(keys))}}}:{self.part(kind)}"
            return f"KEYS[{i + 1}]:kind={kind.name}"
        if how == "outside":
            keys[i] = rng.choice([*OUTSIDE_DB0, "sq:queues", f"sq:{{{VICTIM_QUEUE}}}",
                                  f"sq:{{{VICTIM_QUEUE}}}:", "__keyspace@0__:foo"])
            return f"KEYS[{i + 1}]:outside"
        part = self.part(c.keys[i])
        if how == "badtag":
            bad = rng.choice(["", "a b", "x" * 129, f"{self.atk.queue}~12345",
                              f"{self.atk.queue}~", f"{VICTIM_QUEUE}}}{{{self.atk.queue}",
                              "é", "a\nb", f"{VICTIM_QUEUE}~12345", f"~{VICTIM_QUEUE}",
                              f"{self.atk.queue}/", f"/{ATTACKER_JOBS[0]}",
                              f"{self.atk.queue}/a/b"])
            keys[i] = f"sq:{{{bad}}}:{part}"
            return f"KEYS[{i + 1}]:badtag"
        tag = _TAG_RE.match(keys[i].encode())
        prefix = keys[i][: tag.end()] if tag else "sq:{x}:"
        keys[i] = prefix + rng.choice([
            part + ":x", part.upper(), part + "\n", part + "\x00", "", part + "}",
            "worker:" + VICTIM_QUEUE, "worker:", "lane:1:", "lane:100:x", "announced:",
            "announced:{victim}", part + ":retry", "../" + part])
        return f"KEYS[{i + 1}]:suffix"

    @staticmethod
    def _tag_job(keys: list[Any]) -> str:
        m = _TAG_RE.match(keys[0].encode() if isinstance(keys[0], str) else keys[0])
        # the job of a job's tag ``<queue>/<job>``; a shard's tag is taken whole
        return m[1].decode().rpartition("/")[2] if m else ATTACKER_JOBS[0]

    def mutate_args(self, call: Call) -> str:
        rng, args = self.rng, call.args
        how = rng.choice(["value", "value", "value", "extra", "missing"])
        if how == "value" and args:
            i = rng.randrange(len(args))
            args[i] = hostile_values(rng)
            return f"ARGV[{i + 1}]:value"
        if how == "missing" and args:
            if rng.random() < 0.5:
                k = rng.randrange(1, min(3, len(args)) + 1)
                del args[-k:]
                return f"ARGV:-{k}"
            i = rng.randrange(len(args))
            del args[i]
            return f"ARGV[{i + 1}]:dropped"
        k = rng.randrange(1, 4)
        args.extend(hostile_values(rng) for _ in range(k))
        return f"ARGV:+{k}"

    def mutate_numkeys(self, call: Call) -> str:
        n, total = len(call.keys), len(call.keys) + len(call.args)
        call.numkeys = self.rng.choice([n - 1, n + 1, 0, -1, total, total + 1, 10**30, "abc",
                                        "", "1.0", f" {n}", f"{n}\x00"])
        return f"numkeys={call.numkeys!r}"

    def mutated(self, name: str) -> Call:
        c = CONTRACTS[name]
        call = self.valid(name)
        ops = self.rng.choice([["keys"], ["keys"], ["args"], ["args"], ["args"], ["numkeys"],
                               ["keys", "args"], ["args", "args"]])
        labels = []
        for op in ops:
            if op == "keys":
                labels.append(self.mutate_keys(call, c))
            elif op == "args":
                labels.append(self.mutate_args(call))
            else:
                labels.append(self.mutate_numkeys(call))
        call.label = " ".join(labels)
        return call


def lua_regex(pattern: str) -> str:
    """A Python regex for the Lua pattern ``pattern`` (the subset the contracts use:
    anchors, sets, %w %d and escapes, + * ?)."""
    out, in_set, i = ["(?s)"], False, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%":
            nxt = pattern[i + 1]
            cls = {"w": "A-Za-z0-9", "d": "0-9"}.get(nxt)
            out.append(cls if cls and in_set else f"[{cls}]" if cls else re.escape(nxt))
            i += 2
            continue
        if ch == "[" and not in_set:
            in_set = True
            out.append("[")
        elif ch == "]" and in_set:
            in_set = False
            out.append("]")
        elif in_set:
            out.append(ch if ch == "-" else re.escape(ch))
        elif ch == "^" and i == 0:
            out.append(r"\A")
        elif ch == "$" and i == len(pattern) - 1:
            out.append(r"\Z")
        elif ch in "+*?.":
            out.append(ch)
        else:
            out.append(re.escape(ch))
        i += 1
    if not pattern.endswith("$"):
        out.append(".*")
    return "".join(out)


def _lax_arg(a: Any) -> Any:
    if isinstance(a, Counted):
        return dataclasses.replace(a, group=tuple(_lax_arg(g) for g in a.group))
    if a.kind == "pattern":
        return dataclasses.replace(a, regex=lua_regex(a.lua))
    if a.kind == "entry":  # the guard: at most 41 bytes of <digits>-<digits>
        return dataclasses.replace(a, kind="pattern", regex=r"(?s)\A[0-9]+-[0-9]+\Z", size=41)
    return a


@functools.cache
def lua_twin(name: str) -> Contract:
    """The contract as the Lua guard reads it: its patterns are Lua patterns, laxer by
    design than their Python twins (``[%w:%-]+`` for ``<index> or entry:<id>``)."""
    c = CONTRACTS[name]
    keys = tuple(dataclasses.replace(k, regex=lua_regex(k.lua)) if k.regex else k
                 for k in c.keys)
    return dataclasses.replace(c, keys=keys, args=tuple(_lax_arg(a) for a in c.args),
                               rest=tuple(_lax_arg(a) for a in c.rest),
                               tail=tuple(_lax_arg(a) for a in c.tail))


def python_verdict(call: Call, contract: Contract | None = None) -> bool | None:
    """What the contract's Python twin says of the call as the function receives it
    (None: Redis would not run it: its numkeys is no key count)."""
    raw = call.numkeys
    everything = [*call.keys, *call.args]
    if not re.fullmatch(r"-?[0-9]+", str(raw)) or not 0 <= int(raw) <= len(everything):
        return None
    n = int(raw)
    try:
        (contract or CONTRACTS[call.function]).check(everything[:n], everything[n:])
    except ContractError:
        return False
    except Exception:  # a value the twin cannot even read (bytes that are not UTF-8)
        return False
    return True


# -- what changed -------------------------------------------------------------------------

class Watch:
    """Keyspace notifications and channel messages on the node the calls go to, read
    after each call: a PING on the subscribed connection comes back after every message
    the call caused."""

    def __init__(self, arena: Arena) -> None:
        self.conn = redis.Connection(host=arena.host, port=arena.port, socket_timeout=30,
                                     protocol=2)
        self.conn.connect()
        subs: list[list[Any]] = [["PSUBSCRIBE", "__keyspace@*__:*", "sq:*"]]
        if arena.name == "cluster":  # completions are SPUBLISHed there: by channel name
            subs.append(["SSUBSCRIBE", *arena.victim_channels])
        for sub in subs:
            self.conn.send_command(*sub)
            for _ in range(len(sub) - 1):
                self.conn.read_response()

    def close(self) -> None:
        self.conn.disconnect()

    def drain(self) -> list[str]:
        """What the last calls did to anything but the attacker's keys and channels."""
        self.conn.send_command("PING")
        found: list[str] = []
        while True:
            msg = self.conn.read_response()
            kind = msg[0]
            if kind == b"pong":
                return found
            if kind == b"pmessage":
                channel, data = msg[2], msg[3]
            elif kind in (b"message", b"smessage"):
                channel, data = msg[1], msg[2]
            else:
                continue
            m = _CHANNEL_RE.fullmatch(channel)
            if m is not None:
                db, key = int(m[1]), m[2]
                if db != 0 or not is_attacker_key(key):
                    found.append(f"db{db} {key!r}: {data.decode(errors='replace')}")
            elif not is_attacker_key(channel):
                found.append(f"published on {channel!r}")


def snapshot(arena: Arena) -> dict[tuple[str, bytes], tuple[Any, ...]]:
    """Every watched key: its type, expiry time (PEXPIRETIME) and content."""
    out: dict[tuple[str, bytes], tuple[Any, ...]] = {}
    for label, c, everything in arena.watched:
        keys = [k for k in c.scan_iter(count=1000) if everything or not is_attacker_key(k)]
        p = c.pipeline(transaction=False)
        for k in keys:
            p.type(k)
            p.execute_command("PEXPIRETIME", k)
        heads = p.execute()
        p = c.pipeline(transaction=False)
        shape = []
        for j, k in enumerate(keys):
            t = heads[2 * j]
            if t == b"string":
                p.get(k)
            elif t == b"hash":
                p.hgetall(k)
            elif t == b"list":
                p.lrange(k, 0, -1)
            elif t == b"set":
                p.smembers(k)
            elif t == b"zset":
                p.zrange(k, 0, -1, withscores=True)
            elif t == b"stream":
                p.xrange(k)
                p.xinfo_stream(k)
                p.xinfo_groups(k)
            shape.append(3 if t == b"stream" else 0 if t == b"none" else 1)
        body = p.execute(raise_on_error=False)
        at = 0
        for j, k in enumerate(keys):
            n = shape[j]
            content = tuple(repr(x) for x in body[at:at + n])
            at += n
            out[(label, k)] = (heads[2 * j], heads[2 * j + 1], content)
    return out


def diff(before: dict[Any, Any], after: dict[Any, Any]) -> list[str]:
    changed = []
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        if b != a:
            what = ("created" if b is None else "deleted" if a is None
                    else "type" if a[0] != b[0] else "expiry" if a[1] != b[1] else "content")
            changed.append(f"{key[0]} {key[1]!r}: {what}")
    return changed


# -- the attack ---------------------------------------------------------------------------

@dataclass
class Tally:
    calls: int = 0
    refused: int = 0
    succeeded: int = 0
    changes: int = 0
    keys_changed: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    replies: Counter[str] = field(default_factory=Counter)
    twins: Counter[str] = field(default_factory=Counter)
    twin_examples: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    valid_refused: list[str] = field(default_factory=list)
    #: calls whose keys are all of the suite's one slot yet stopped by the cluster
    crossslot: list[str] = field(default_factory=list)
    #: errors of a function past its guard (its own error, not a refusal): one example
    #: call per function and message
    script_errors: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "refused": self.refused, "succeeded": self.succeeded,
                "changes": self.changes, "keys_changed": self.keys_changed[:50],
                "writes": self.writes[:50], "replies": dict(self.replies),
                "twins": dict(self.twins), "twin_examples": self.twin_examples[:20],
                "dropped": self.dropped, "valid_refused": self.valid_refused,
                "script_errors": self.script_errors, "crossslot": self.crossslot}


_CLUSTER_ERRORS = (redis.exceptions.ClusterCrossSlotError, redis.exceptions.AskError,
                   redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError)


def classify(err: redis.ResponseError) -> str:
    """noperm (the ACL), guard (the function's guard), cluster (CROSSSLOT, MOVED: redis-py
    drops their code from the message), numkeys, other (an error of the function)."""
    text = str(err)
    if isinstance(err, redis.exceptions.NoPermissionError) or text.startswith("NOPERM"):
        return "noperm"
    if " refused: " in text and text.startswith("sq_"):
        return "guard"
    if isinstance(err, _CLUSTER_ERRORS) or text.startswith(("CROSSSLOT", "MOVED", "ASK")):
        return "cluster"
    if text.startswith("sq.fcall") or "numkeys" in text.lower() or "number of keys" in \
            text.lower() or "wrong number" in text.lower():
        return "numkeys"
    return "other"


def send(conn: redis.Redis, arena: Arena, call: Call, tally: Tally) -> str:
    """Send one call; the reply's class (ok, guard, noperm, cluster, numkeys, other)."""
    tally.calls += 1
    try:
        conn.execute_command(*call.command(arena.command))
        outcome = "ok"
        tally.succeeded += 1
    except redis.ResponseError as e:
        outcome = classify(e)
        tally.refused += 1
        if outcome == "other":
            text = re.sub(r"sq:\{[^{}]*\}", "sq:{..}", str(e))
            text = re.sub(r" script: .*", "", text)[:90]
            tally.script_errors.setdefault(f"sq_{call.function}: {text}", call.short()[:300])
    except (redis.ConnectionError, redis.TimeoutError) as e:
        tally.dropped.append(f"{call.short()}: {e!r}")
        conn.connection_pool.disconnect()
        outcome = "dropped"
    tally.replies[outcome] += 1
    if outcome == "cluster" and re.fullmatch(r"[0-9]+", str(call.numkeys)):
        keys = [*call.keys, *call.args][: int(call.numkeys)]
        if keys and all(key_slot(k if isinstance(k, bytes) else str(k).encode()) == SLOT
                        for k in keys):
            tally.crossslot.append(call.short())
    return outcome


def attack(arena: Arena, role: str, functions_: Sequence[str], per_function: int,
           seed: str, watch: Watch, forced: Callable[[Maker, str], list[Call]] | None = None
           ) -> Tally:
    """The valid call and ``per_function`` mutated calls of each function, as ``role``;
    what each did to a watched key or channel is noted by call; the snapshot of
    watched keys before and after is compared."""
    tally = Tally()
    conn = arena.client(role)
    before = snapshot(arena)
    run_id = arena.run_id()
    try:
        makers = {fn: Maker(random.Random(f"{seed}:{arena.name}:{role}:{fn}"), arena.attacker)
                  for fn in sorted(functions_)}
        plan: list[tuple[str, Call]] = []
        if forced:  # first: before a random call finishes the attacker's jobs
            plan += [(fn, call) for fn, m in makers.items() for call in forced(m, fn)]
        for fn, m in makers.items():
            plan.append((fn, m.valid(fn)))
            plan += [(fn, m.mutated(fn)) for _ in range(per_function)]
        for fn, call in plan:
            outcome = send(conn, arena, call, tally)
            seen = watch.drain()
            if seen:
                tally.writes.append(f"{call.short()} -> {seen[:5]}")
            if call.label == "valid" and outcome in ("guard", "noperm"):
                tally.valid_refused.append(f"{call.short()} -> {outcome}")
            verdict = python_verdict(call)
            if verdict is not None and outcome in ("ok", "guard", "other"):
                lua_ran = outcome != "guard"
                if verdict != lua_ran:
                    key = ("lua ran, python refuses" if lua_ran
                           else "lua refused, python passes")
                    if lua_ran and python_verdict(call, lua_twin(fn)):
                        key = "lua pattern laxer than its python twin"
                    tally.twins[key] += 1
                    if len(tally.twin_examples) < 20:
                        tally.twin_examples.append(f"{key}: {call.short()}")
    finally:
        conn.close()
    after = snapshot(arena)
    tally.keys_changed = diff(before, after)
    tally.changes = len(tally.keys_changed) + len(tally.writes)
    assert arena.run_id() == run_id, "the server restarted"
    return tally


def summary(arena: Arena, role: str, t: Tally) -> str:
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(t.replies.items())
                      if not k.startswith("other:"))
    return (f"{arena.name} {role}: {t.calls} calls, {t.refused} refused, {t.changes} changes "
            f"({kinds})")


def save_counts(path: Path, setup: str, counts: dict[str, Any]) -> None:
    data = json.loads(path.read_text()) if path.exists() else {}
    data[setup] = counts
    path.write_text(json.dumps(data, indent=2, sort_keys=True))
