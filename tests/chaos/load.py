"""The producers of a chaos run, the completion subscriber and the replayer.

Producers (threads of the runner) submit plain jobs, scheduled jobs, ``submit_many`` batches,
streaming jobs (open, several adds, finalize), jobs with a dedup key that are
submitted again (at once from a second thread, and later), and one job of more
than ``ADD_CHUNK`` sub-requests. Every operation is retried until it succeeds,
in its idempotent form: the same job id, the same dedup key; a streaming add is
retried only after the job's ``total`` shows it was not applied. What was
submitted goes to the :class:`Ledger`, which the checks compare with Redis.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from streamq import Queue, config
from streamq.errors import StreamqError
from streamq.keys import QueueKeys

T = TypeVar("T")
MAX_DELIVERIES = 3
ERRORS = (StreamqError, redis.RedisError, OSError)


@dataclass
class JobRecord:
    """A job the producers made: its payloads by index."""

    job_id: str
    kind: str  # plain, many, stream, dedup, big, replay, scheduled, cancel
    payloads: list[dict[str, Any]]
    max_deliveries: int = MAX_DELIVERIES
    dedup: str = ""
    confirmed: bool = False  # the call that makes it returned (else it may not exist)
    finalized: bool = True
    cancel_sent: bool = False  # a cancel of it was sent (it may end cancelled)


@dataclass
class Ledger:
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    dedup_ids: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    dedup_resubmits: int = 0
    #: (job, index) of a dead letter -> job it was replayed into ("" when unknown)
    replays: dict[tuple[str, int], str] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)  # retried producer errors
    gave_up: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, rec: JobRecord) -> None:
        with self.lock:
            self.jobs[rec.job_id] = rec

    def note(self, what: str, e: BaseException) -> None:
        with self.lock:
            self.errors[f"{what}: {type(e).__name__}"] += 1


class GaveUp(Exception):
    pass


class Producer(threading.Thread):
    def __init__(self, name: str, url: str, queue: str, ledger: Ledger, rng: random.Random,
                 load_end: float, give_up: float, big: bool) -> None:
        super().__init__(name=f"chaos-{name}", daemon=True)
        self.tag, self.url, self.ledger, self.rng = name, url, ledger, rng
        self.q = Queue(queue, url, retention_s=3600)
        self.load_end, self.give_up, self.big = load_end, give_up, big
        self.seq = 0
        self.stop = threading.Event()
        self.crashed: BaseException | None = None
        self.later: list[tuple[float, str, list[dict[str, Any]]]] = []

    # -- helpers -------------------------------------------------------------------------

    def payload(self) -> dict[str, Any]:
        self.seq += 1
        r = self.rng.random()
        mode, k = ("poison", 0) if r < 0.06 else ("flaky", self.rng.randint(1, 2)) \
            if r < 0.18 else ("ok", 0)
        sleep = self.rng.choice((0, 0, 0, 0, 0, 0, 0.01, 0.05, 0.2, 0.6))
        return {"u": f"{self.tag}-{self.seq}", "n": self.rng.randint(0, 10**6), "m": mode,
                "k": k, "s": sleep}

    def payloads(self, lo: int, hi: int) -> list[dict[str, Any]]:
        return [self.payload() for _ in range(self.rng.randint(lo, hi))]

    def retry(self, what: str, fn: Callable[[], T]) -> T:
        while True:
            try:
                return fn()
            except ERRORS as e:
                self.ledger.note(what, e)
                if time.monotonic() > self.give_up or self.stop.is_set():
                    self.ledger.gave_up.append(f"{self.tag} {what}: {type(e).__name__}: {e}")
                    raise GaveUp(what) from e
                time.sleep(self.rng.uniform(0.1, 0.4))

    def options(self) -> dict[str, Any]:
        return {"priority": self.rng.choice((10, 50, 50, 90)),
                "concurrency": self.rng.randint(1, 3), "max_deliveries": MAX_DELIVERIES,
                "client": self.rng.choice(("a", "b"))}

    # -- actions -------------------------------------------------------------------------

    def plain(self, kind: str = "plain", payloads: list[dict[str, Any]] | None = None) -> None:
        jid = uuid.uuid4().hex
        rec = JobRecord(jid, kind, payloads or self.payloads(1, 8))
        self.ledger.add(rec)
        opts = self.options()
        self.retry("submit", lambda: self.q.submit(rec.payloads, job_id=jid, **opts))
        rec.confirmed = True

    def scheduled(self) -> None:
        """A plain job scheduled up to 3 s ahead (its sub-requests wait in its retry set
        until then, promoted by the workers)."""
        jid = uuid.uuid4().hex
        rec = JobRecord(jid, "scheduled", self.payloads(1, 6))
        self.ledger.add(rec)
        opts = self.options()
        delay = self.rng.uniform(0.1, 3.0)
        self.retry("submit", lambda: self.q.submit(rec.payloads, job_id=jid, delay=delay,
                                                   **opts))
        rec.confirmed = True

    def cancelled(self) -> None:
        """A job (one sub-request: a small job, or several) cancelled a moment after its
        submit, racing the workers: it ends cancelled or completed, once."""
        jid = uuid.uuid4().hex
        rec = JobRecord(jid, "cancel", self.payloads(1, 1) if self.rng.random() < 0.3
                        else self.payloads(2, 10))
        self.ledger.add(rec)
        opts = self.options()
        small = len(rec.payloads) == 1 and self.rng.random() < 0.5
        if small:  # a generated id: the small-job lane
            jid = self.retry("submit", lambda: self.q.submit(rec.payloads, **opts)).id
            with self.ledger.lock:
                self.ledger.jobs.pop(rec.job_id, None)
            rec.job_id = jid
            self.ledger.add(rec)
        else:
            self.retry("submit", lambda: self.q.submit(rec.payloads, job_id=jid, **opts))
        rec.confirmed = True
        time.sleep(self.rng.uniform(0.0, 0.6))
        rec.cancel_sent = True
        wait = self.rng.random() < 0.5
        self.retry("cancel", lambda: self.q.cancel(jid, wait=wait, timeout=2.0))

    def many(self) -> None:
        batch = [self.payloads(1, 5) for _ in range(self.rng.randint(2, 6))]
        opts = self.options()
        handles = self.retry("submit_many", lambda: self.q.submit_many(batch, **opts))
        for h, p in zip(handles, batch):
            self.ledger.add(JobRecord(h.id, "many", p, confirmed=True))

    def stream(self) -> None:
        jid = uuid.uuid4().hex
        rec = JobRecord(jid, "stream", [], finalized=False)
        self.ledger.add(rec)
        opts = self.options()
        job = self.retry("open", lambda: self.q.open(job_id=jid, **opts))
        rec.confirmed = True
        for _ in range(self.rng.randint(1, 4)):
            chunk = self.payloads(1, 5)
            # retried with its batch id: an add that ran before its error adds nothing again
            batch = uuid.uuid4().hex
            self.retry("add", lambda c=chunk, b=batch: job.add_many(c, batch_id=b))
            rec.payloads.extend(chunk)
            time.sleep(self.rng.uniform(0.0, 0.4))
        self.retry("finalize", job.finalize)
        rec.finalized = True

    def dedup(self) -> None:
        key = f"dk-{self.tag}-{self.seq}"
        payloads = self.payloads(1, 5)
        opts = self.options()

        def submit() -> str:
            job = self.retry("dedup submit",
                             lambda: self.q.submit(payloads, dedup_key=key, **opts))
            with self.ledger.lock:
                self.ledger.dedup_ids[key].add(job.id)
                if job.id not in self.ledger.jobs:
                    self.ledger.jobs[job.id] = JobRecord(job.id, "dedup", payloads, dedup=key,
                                                         confirmed=True)
            return job.id

        twin: threading.Thread | None = None
        if self.rng.random() < 0.5:  # a second producer submits the same key at once
            twin = threading.Thread(target=self._quietly, args=(submit,), daemon=True)
            twin.start()
            with self.ledger.lock:
                self.ledger.dedup_resubmits += 1
        submit()
        if twin is not None:
            twin.join(60)
        for _ in range(self.rng.randint(0, 2)):  # and again later
            self.later.append((time.monotonic() + self.rng.uniform(0.5, 5), key, payloads))

    def _quietly(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except GaveUp:
            pass

    def resubmit_due(self) -> None:
        now = time.monotonic()
        due = [x for x in self.later if x[0] <= now]
        self.later = [x for x in self.later if x[0] > now]
        for _, key, payloads in due:
            job = self.retry("dedup resubmit",
                             lambda k=key, p=payloads: self.q.submit(p, dedup_key=k))
            with self.ledger.lock:
                self.ledger.dedup_ids[key].add(job.id)
                self.ledger.dedup_resubmits += 1

    def run(self) -> None:
        actions = ([self.plain] * 6 + [self.many] * 3 + [self.stream] * 4 + [self.dedup] * 3
                   + [self.scheduled] * 2 + [self.cancelled] * 2)
        try:
            while time.monotonic() < self.load_end and not self.stop.is_set():
                if self.big:  # one job past ADD_CHUNK: the fenced multi-call submit
                    self.big = False
                    pl = [{"u": f"{self.tag}-big-{i}", "n": i, "m": "ok", "k": 0, "s": 0}
                          for i in range(config.ADD_CHUNK + 20)]
                    self.plain("big", pl)
                self.rng.choice(actions)()
                self.resubmit_due()
                time.sleep(self.rng.uniform(0.02, 0.25))
            while self.later and not self.stop.is_set():
                self.later = [(0.0, k, p) for _, k, p in self.later]
                self.resubmit_due()
        except GaveUp:
            pass
        except BaseException as e:  # reported by the runner
            self.crashed = e
        finally:
            self.q.close()


def replay_dead(q: Queue, ledger: Ledger) -> int:
    """Replay every dead letter not replayed before (each (job, index) once)."""
    n = 0
    for d in q.dead_letters(count=10_000):
        if not d.index.isdigit():
            continue
        key = (d.job_id, int(d.index))
        made = ledger.jobs.get(d.job_id)
        if key in ledger.replays or (made is not None and made.kind == "replay"):
            continue  # once per dead letter, and not again from the job its replay made
        ledger.replays[key] = ""
        try:
            target = q.replay_dead(d.id)
        except ERRORS as e:
            ledger.note("replay", e)
            continue
        n += 1
        ledger.replays[key] = target
        if target != d.job_id:
            payload = json.loads(d.payload) if d.kind == b"j" else {}
            ledger.add(JobRecord(target, "replay", [payload], confirmed=True))
    return n


class Subscriber(threading.Thread):
    """Counts the completions published on the queue's channels, per job, and the
    spells it was not subscribed (a publication then is lost by design)."""

    def __init__(self, port: int, queue: str, tags: list[str]) -> None:
        super().__init__(name="chaos-subscriber", daemon=True)
        self.port = port
        self.channels = [QueueKeys(queue, t).channel for t in tags]  # one per shard
        self.pubs: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.gaps: list[tuple[float, float]] = []  # (from, to), epoch seconds
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        down_since: float | None = None
        last_ok = time.time()
        while not self.stop.is_set():
            # no retries: a lost connection must show here, not be re-subscribed silently
            c = redis.Redis(port=self.port, socket_timeout=5, socket_connect_timeout=2,
                            retry=Retry(NoBackoff(), 0))
            ps = c.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            try:
                ps.subscribe(*self.channels)
                ps.get_message(timeout=1.0)  # the subscribe confirmation
                if down_since is not None:
                    self.gaps.append((down_since, time.time()))
                    down_since = None
                self.ready.set()
                while not self.stop.is_set():
                    last_ok = time.time()
                    m = ps.get_message(timeout=0.5)
                    if m and m["type"] == "message":
                        d = json.loads(m["data"])
                        self.pubs[d["job_id"]].append(d)
            except (redis.RedisError, OSError):
                if down_since is None:
                    down_since = last_ok
                time.sleep(0.1)
            finally:
                try:
                    ps.close()
                    c.close()
                except (redis.RedisError, OSError):
                    pass
        if down_since is not None:
            self.gaps.append((down_since, time.time()))

    def missed(self, at_ms: int) -> bool:
        """True when a publication at ``at_ms`` (Redis's clock, which is this host's)
        fell in a spell without subscription."""
        t = at_ms / 1000
        return any(a - 0.5 <= t <= b + 0.5 for a, b in self.gaps)
