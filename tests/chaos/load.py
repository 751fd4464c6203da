"""The producers of a chaos run, the completion subscriber and the replayer.

Producers (threads of the runner) submit plain jobs, scheduled jobs, ``submit_many`` batches,
streaming jobs (open, several adds, finalize), jobs with a dedup key that are
submitted again (at once from a second thread, and later), and one job of more
than ``ADD_CHUNK`` sub-requests. They also steer work while it runs: re-prioritize
(priority up and down, concurrency lowered then raised back) plain and streaming
jobs, and small jobs (moved while they wait); cancel a job whose reply is lost at the
producers' proxy and resent with the same token, queued, running or finishing, on
both lanes; and submit jobs with a timeout whose handlers may run past it
(``hang``: an async handler ignores its cancellation). Every operation is retried until it succeeds,
in its idempotent form: the same job id, the same dedup key; a streaming add is
retried only after the job's ``total`` shows it was not applied. What was
submitted goes to the :class:`Ledger`, which the checks compare with Redis.
"""

from __future__ import annotations

import json
import os
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

from streamq import Queue
from streamq.base import config
from streamq.base.keys import QueueKeys
from streamq.errors import ConfigError, StreamqError
from tests.proxy import ReplyDropProxy

from .handler import now_ns

T = TypeVar("T")
MAX_DELIVERIES = 3
#: steering threads a producer runs at once (Producer.aside)
ASIDE = 4
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
    #: when it was confirmed (epoch s): a SIGKILL of Redis soon after may lose it
    confirmed_at: float = 0.0
    finalized: bool = True
    #: when its finalize returned (epoch s): a SIGKILL of Redis soon after may lose it
    finalized_at: float = 0.0
    cancel_sent: bool = False  # a cancel of it was sent (it may end cancelled)
    concurrency: int = 0  # as submitted (0: not known here; its meta says)
    #: re-prioritized concurrencies: (figure, sent ns, returned ns or INF), CLOCK_MONOTONIC
    caps: list[tuple[int, int, float]] = field(default_factory=list)
    #: a cancel resent after its lost reply: (stage, what the resend reported: cancelled,
    #: state); the job must end as it says
    cancel_report: tuple[str, bool, str] | None = None

    def __post_init__(self) -> None:
        if self.confirmed and not self.confirmed_at:
            self.confirmed_at = time.time()

    def confirm(self) -> None:
        self.confirmed, self.confirmed_at = True, time.time()

    def finalize_done(self) -> None:
        self.finalized, self.finalized_at = True, time.time()


@dataclass
class Ledger:
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    dedup_ids: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    dedup_resubmits: int = 0
    #: (job, index) of a dead letter -> job it was replayed into ("" when unknown)
    replays: dict[tuple[str, int], str] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)  # retried producer errors
    #: re-prioritize calls by outcome, cancels resent after a lost reply by stage
    steering: Counter[str] = field(default_factory=Counter)
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
                 load_end: float, give_up: float, big: bool, proxy: ReplyDropProxy,
                 workdir: str, sabotage: bool = False) -> None:
        super().__init__(name=f"chaos-{name}", daemon=True)
        self.tag, self.url, self.ledger, self.rng = name, url, ledger, rng
        self.q = Queue(queue, url, retention_s=3600)
        #: the producers' proxy, whose replies a resent cancel loses, and a client behind it
        self.proxy = proxy
        self.pq = self.q if url == proxy.url else Queue(queue, proxy.url, retention_s=3600)
        self.workdir = workdir
        #: resend a cancel with a new token, as a client that does not keep it would
        self.sabotage = sabotage
        self.load_end, self.give_up, self.big = load_end, give_up, big
        self.seq = 0
        self.stop = threading.Event()
        self.crashed: BaseException | None = None
        self.later: list[tuple[float, str, list[dict[str, Any]]]] = []
        self.helpers: list[threading.Thread] = []  # steering threads (aside)

    # -- helpers -------------------------------------------------------------------------

    def payload(self, sleeps: tuple[float, ...] = (0, 0, 0, 0, 0, 0, 0.01, 0.05, 0.2, 0.6),
                hang: float = 0.0) -> dict[str, Any]:
        """A payload; with ``hang``, that share of them run past their job's timeout."""
        with self.ledger.lock:  # steering threads make payloads too: one uid each
            self.seq += 1
            seq = self.seq
        r = self.rng.random()
        mode, k = ("poison", 0) if r < 0.06 else ("flaky", self.rng.randint(1, 2)) \
            if r < 0.18 else ("ok", 0)
        sleep = self.rng.choice(sleeps)
        if self.rng.random() < hang:  # past the deadline by less or more than the grace
            mode, k, sleep = "hang", self.rng.randint(1, 3), self.rng.choice((0.3, 1.6))
        return {"u": f"{self.tag}-{seq}", "n": self.rng.randint(0, 10**6), "m": mode,
                "k": k, "s": sleep}

    def payloads(self, lo: int, hi: int, **kw: Any) -> list[dict[str, Any]]:
        return [self.payload(**kw) for _ in range(self.rng.randint(lo, hi))]

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
        rec.concurrency = opts["concurrency"]
        self.retry("submit", lambda: self.q.submit(rec.payloads, job_id=jid, **opts))
        rec.confirm()

    def scheduled(self) -> None:
        """A plain job scheduled up to 3 s ahead (its sub-requests wait in its retry set
        until then, promoted by the workers)."""
        jid = uuid.uuid4().hex
        rec = JobRecord(jid, "scheduled", self.payloads(1, 6))
        self.ledger.add(rec)
        opts = self.options()
        rec.concurrency = opts["concurrency"]
        delay = self.rng.uniform(0.1, 3.0)
        self.retry("submit", lambda: self.q.submit(rec.payloads, job_id=jid, delay=delay,
                                                   **opts))
        rec.confirm()

    def cancelled(self) -> None:
        """A job (one sub-request: a small job, or several) cancelled a moment after its
        submit, racing the workers: it ends cancelled or completed, once."""
        jid = uuid.uuid4().hex
        rec = JobRecord(jid, "cancel", self.payloads(1, 1) if self.rng.random() < 0.3
                        else self.payloads(2, 10))
        self.ledger.add(rec)
        opts = self.options()
        rec.concurrency = opts["concurrency"]
        small = len(rec.payloads) == 1 and self.rng.random() < 0.5
        if small:  # a generated id: the small-job lane
            jid = self.retry("submit", lambda: self.q.submit(rec.payloads, **opts)).id
            with self.ledger.lock:
                self.ledger.jobs.pop(rec.job_id, None)
            rec.job_id = jid
            self.ledger.add(rec)
        else:
            self.retry("submit", lambda: self.q.submit(rec.payloads, job_id=jid, **opts))
        rec.confirm()
        time.sleep(self.rng.uniform(0.0, 0.6))
        rec.cancel_sent = True
        wait = self.rng.random() < 0.5
        self.retry("cancel", lambda: self.q.cancel(jid, wait=wait, timeout=2.0))

    # -- steering running work ----------------------------------------------------------

    def reprioritize(self, rec: JobRecord, **change: int) -> bool:
        """Re-prioritize ``rec``'s job, resent until it answers; a concurrency change goes
        to the ledger with when it was sent and returned. False when it was refused."""
        sent = now_ns()
        while True:
            try:
                self.q.reprioritize(rec.job_id, **change)
                outcome = "applied"
                break
            except ConfigError as e:
                if "not registered yet" in str(e) and time.monotonic() < self.give_up:
                    time.sleep(0.05)  # its submit is under way
                    continue
                outcome = "refused (small job)" if "small job" in str(e) else "refused (ended)"
                break
            except ERRORS as e:
                self.ledger.note("reprioritize", e)
                if time.monotonic() > self.give_up or self.stop.is_set():
                    outcome = "unconfirmed"
                    break
                time.sleep(self.rng.uniform(0.1, 0.4))
        with self.ledger.lock:
            self.ledger.steering[f"reprioritize {outcome}"] += 1
        if "concurrency" in change and outcome != "refused (small job)":
            # applied, or maybe applied by a try whose reply was lost before the job ended
            rec.caps.append((change["concurrency"], sent,
                             float("inf") if outcome == "unconfirmed" else now_ns()))
        return not outcome.startswith("refused")

    def reprioritized(self) -> None:
        """A job with its own stream (plain or streaming) re-prioritized while it runs:
        priority up then down, concurrency lowered then raised back; or a small job,
        whose entry moves to the new priority's lane while it waits (and which refuses
        it while a worker runs it)."""
        jid = uuid.uuid4().hex
        # short handlers: a token a lowered concurrency takes away ends its round soon
        sleeps = (0, 0, 0.02, 0.05, 0.1, 0.2)
        opts = self.options()
        if self.rng.random() < 0.25:  # a small job (generated id, one sub-request)
            rec = JobRecord(jid, "reprioritize", self.payloads(1, 1, sleeps=sleeps),
                            concurrency=opts["concurrency"])
            rec.job_id = self.retry("submit", lambda: self.q.submit(rec.payloads, **opts)).id
            rec.confirm()
            self.ledger.add(rec)
            self.reprioritize(rec, priority=self.rng.randint(0, 99))
            return
        streaming = self.rng.random() < 0.4
        opts["concurrency"] = self.rng.randint(2, 3)
        rec = JobRecord(jid, "reprioritize", [] if streaming else
                        self.payloads(4, 12, sleeps=sleeps), concurrency=opts["concurrency"],
                        finalized=not streaming)
        self.ledger.add(rec)
        job = None
        if streaming:
            job = self.retry("open", lambda: self.q.open(job_id=jid, **opts))
            chunk = self.payloads(2, 6, sleeps=sleeps)
            batch = uuid.uuid4().hex
            self.retry("add", lambda: job.add_many(chunk, batch_id=batch))
            rec.payloads.extend(chunk)
        else:
            self.retry("submit", lambda: self.q.submit(rec.payloads, job_id=jid, **opts))
        rec.confirm()
        steps: list[dict[str, int]] = [
            {"priority": self.rng.randint(0, 20)}, {"priority": self.rng.randint(70, 99)},
            {"concurrency": 1}, {"concurrency": opts["concurrency"]}]
        if self.rng.random() < 0.5:
            steps[2]["priority"] = self.rng.randint(0, 99)  # both at once
        for step in steps:
            time.sleep(self.rng.uniform(0.0, 0.3))
            if not self.reprioritize(rec, **step):
                break
            if job is not None and self.rng.random() < 0.5:
                chunk = self.payloads(1, 4, sleeps=sleeps)
                batch = uuid.uuid4().hex
                self.retry("add", lambda c=chunk, b=batch: job.add_many(c, batch_id=b))
                rec.payloads.extend(chunk)
        if job is not None:
            self.retry("finalize", job.finalize)
            rec.finalize_done()

    def _watch(self, jid: str, what: str, n: int, timeout: float) -> None:
        """Wait until the job's watched runs wrote ``n`` lines of kind ``what`` (S for
        starts; E, L or F for ends), or ``timeout`` seconds."""
        path = os.path.join(self.workdir, f"watch-{jid}")
        kinds = {"S"} if what == "S" else {"E", "L", "F"}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stop.is_set():
            try:
                with open(path) as f:
                    if sum(1 for ln in f if ln[:1] in kinds) >= n:
                        return
            except FileNotFoundError:
                pass
            time.sleep(0.01)

    def cancel_resent(self) -> None:
        """Cancel a job (a small job, or one with its own stream) queued, running or
        finishing, through the producers' proxy, which loses the reply to the first
        call: the call is resent with the same token and must report what the first
        did, and the job end as it says."""
        stage = self.rng.choice(("queued", "running", "finishing"))
        small = self.rng.random() < 0.4
        sleeps = (0.3, 0.5) if stage == "running" else (0, 0, 0.02, 0.1)
        rec = JobRecord(uuid.uuid4().hex, "cancel", self.payloads(1, 1 if small else 6,
                                                                  sleeps=sleeps))
        for p in rec.payloads:
            p["w"] = 1  # its runs are written where _watch reads them
        opts = self.options()
        rec.concurrency = opts["concurrency"]
        if small:
            rec.job_id = self.retry("submit", lambda: self.q.submit(rec.payloads, **opts)).id
        else:
            delay = self.rng.uniform(0.5, 2.0) if stage == "queued" else None
            jid = rec.job_id
            self.ledger.add(rec)
            self.retry("submit", lambda: self.q.submit(rec.payloads, job_id=jid, delay=delay,
                                                       **opts))
        rec.confirm()
        self.ledger.add(rec)
        if stage == "running":
            self._watch(rec.job_id, "S", 1, 5.0)
        elif stage == "finishing":
            self._watch(rec.job_id, "E", len(rec.payloads), 8.0)
        token = uuid.uuid4().hex
        marker = token.encode()
        self.proxy.drop_reply_to(marker)
        rec.cancel_sent = True
        wait = self.rng.random() < 0.5
        report = self.retry("cancel resent", lambda: self.pq.cancel(
            rec.job_id, wait=wait, timeout=2.0, token=token))
        lost = not self.proxy.armed(marker)
        if not lost:  # the call never sent its token (it did not get that far)
            self.proxy.disarm(marker)
        if self.sabotage:  # (--sabotage cancel) the resend forgets the token
            report = self.retry("cancel resent", lambda: self.pq.cancel(
                rec.job_id, wait=wait, timeout=2.0))
        rec.cancel_report = (stage, report.cancelled, report.state)
        with self.ledger.lock:
            self.ledger.steering[f"cancel {stage}" + (" resent" if lost else " not resent")] += 1
            self.ledger.steering[f"cancel {'cancelled' if report.cancelled else 'too late'}"] += 1

    def timed(self) -> None:
        """A job with a timeout, some of whose handlers run past it (``hang``): the
        worker gives them up (an async one is cancelled and ignores it) and their late
        values must never be stored."""
        jid = uuid.uuid4().hex
        rec = JobRecord(jid, "timeout", self.payloads(1, 6, sleeps=(0, 0, 0.02, 0.1),
                                                      hang=0.4))
        self.ledger.add(rec)
        opts = self.options()
        rec.concurrency = opts["concurrency"]
        timeout = self.rng.choice((0.4, 0.8))
        self.retry("submit", lambda: self.q.submit(rec.payloads, job_id=jid, timeout=timeout,
                                                   **opts))
        rec.confirm()

    def many(self) -> None:
        batch = [self.payloads(1, 5) for _ in range(self.rng.randint(2, 6))]
        opts = self.options()
        handles = self.retry("submit_many", lambda: self.q.submit_many(batch, **opts))
        for h, p in zip(handles, batch):
            self.ledger.add(JobRecord(h.id, "many", p, confirmed=True,
                                      concurrency=opts["concurrency"]))

    def stream(self) -> None:
        jid = uuid.uuid4().hex
        rec = JobRecord(jid, "stream", [], finalized=False)
        self.ledger.add(rec)
        opts = self.options()
        rec.concurrency = opts["concurrency"]
        job = self.retry("open", lambda: self.q.open(job_id=jid, **opts))
        rec.confirm()
        for _ in range(self.rng.randint(1, 4)):
            chunk = self.payloads(1, 5)
            # retried with its batch id: an add that ran before its error adds nothing again
            batch = uuid.uuid4().hex
            self.retry("add", lambda c=chunk, b=batch: job.add_many(c, batch_id=b))
            rec.payloads.extend(chunk)
            time.sleep(self.rng.uniform(0.0, 0.4))
        self.retry("finalize", job.finalize)
        rec.finalize_done()

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
                    self.ledger.jobs[job.id] = JobRecord(
                        job.id, "dedup", payloads, dedup=key, confirmed=True,
                        concurrency=opts["concurrency"])
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
        except BaseException as e:  # reported by the runner
            self.crashed = e

    def aside(self, fn: Callable[[], Any]) -> Callable[[], None]:
        """``fn`` (which waits on running work) in a thread of its own while this one
        goes on submitting; at most ``ASIDE`` at once, else here."""
        def start() -> None:
            self.helpers = [t for t in self.helpers if t.is_alive()]
            if len(self.helpers) >= ASIDE:
                fn()
                return
            t = threading.Thread(target=self._quietly, args=(fn,), daemon=True,
                                 name=f"chaos-{self.tag}-{fn.__name__}")
            t.start()
            self.helpers.append(t)
        return start

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
                   + [self.scheduled] * 2 + [self.cancelled] * 2
                   + [self.aside(self.reprioritized)] * 2 + [self.aside(self.cancel_resent)] * 2
                   + [self.timed] * 2)
        # every steering scenario once, first, so that a short run has each of them too
        first = [self.aside(self.reprioritized), self.aside(self.cancel_resent), self.timed]
        try:
            while time.monotonic() < self.load_end and not self.stop.is_set():
                if first:
                    first.pop(0)()
                    continue
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
            for t in self.helpers:
                t.join(max(1.0, self.give_up - time.monotonic()))
        except GaveUp:
            pass
        except BaseException as e:  # reported by the runner
            self.crashed = e
        finally:
            self.q.close()
            if self.pq is not self.q:
                self.pq.close()


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
