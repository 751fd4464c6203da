"""The worker: lease tokens, read sub-requests, run the handler, acknowledge.

A worker process runs ``concurrency`` slots, each a thread. A slot claims a
token (permission to run one sub-request of one job at a time), reads up to
``batch`` entries of that job with XREADGROUP, runs them one after another,
acknowledges them (XACK + XDEL + result, one script per job), finishes jobs
that completed, and settles the token: back to ready, parked (nothing
deliverable) or dropped (job finished) while claiming the next one in the same
round trip. With nothing ready a slot blocks on the queue's wake list.

Sync handlers run in the slot threads; ``async def`` handlers run on one
event loop thread. SIGTERM or SIGINT drain: each slot finishes the
sub-request it is running, hands back the entries it read but did not start,
releases its tokens, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from . import config
from .client import Queue, now_ms
from .codec import decode, encode_result
from .connection import ACCESS_ERRORS, CONNECTION_ERRORS, connect, ping, pipelined
from .deadletters import announce
from .errors import ConfigError, ConnectionFailed, NonRetryable, PayloadError, RetryLater
from .keys import JobKeys, token_job
from .metrics import WorkerMetrics
from .models import Task
from .scripts import JobReply

log = logging.getLogger("streamq.worker")

#: (queue, job id, index, entry id, attempt) of the sub-request being run; a Task is made
#: from it only when a handler asks, not for every sub-request
_current: contextvars.ContextVar[tuple[str, str, int, str, int] | None] = contextvars.ContextVar(
    "streamq_task", default=None)


def current_task() -> Task | None:
    """The sub-request the calling handler is running (None outside a handler)."""
    fields = _current.get()
    return None if fields is None else Task(*fields)


Handler = Callable[[Any], Any]
#: a job and the results of its entries to acknowledge: (entry id, index, encoded result)
_Batch = tuple[JobKeys, list[tuple[str, int, bytes]]]
_UNREAD = object()  # a claimed token's job not read ahead (a read's reply may be None)


def _entries(reply: Any) -> list[tuple[bytes, list[bytes]]]:
    """The entries of a raw XREADGROUP reply of one stream, each an id and its flat
    field list ``[field, value, ...]``; the reply is a RESP2 list
    ``[[stream, [[id, [field, value, ...]], ...]]]``, a RESP3 map, or nil."""
    if not reply:
        return []
    streams = reply.values() if isinstance(reply, dict) else [s[1] for s in reply]
    return [(entry_id, flat or []) for entries in streams for entry_id, flat in entries]


def _fields(flat: list[bytes]) -> dict[bytes, bytes]:
    it = iter(flat)
    return dict(zip(it, it))


def _int_field(fields: dict[bytes, bytes], name: bytes) -> int | None:
    try:
        value = int(fields[name])
    except (KeyError, ValueError):
        return None
    return value if value >= 0 else None


@dataclass
class _Stats:
    processed: int = 0
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Worker:
    """Serve one queue with ``handler(payload) -> result``."""

    def __init__(
        self,
        queue: str,
        handler: Handler,
        url: str | None = None,
        *,
        client: redis.Redis | None = None,
        concurrency: int = config.DEFAULT_WORKER_CONCURRENCY,
        batch: int = config.DEFAULT_BATCH,
        prefetch: int = config.DEFAULT_PREFETCH,
        lease_ms: int = config.DEFAULT_LEASE_MS,
        heartbeat_s: float = config.DEFAULT_HEARTBEAT_S,
        idle_wait_s: float = config.DEFAULT_IDLE_WAIT_S,
        ack_flush_s: float = config.DEFAULT_ACK_FLUSH_S,
        worker_id: str | None = None,
        retention_s: float = config.DEFAULT_RETENTION_S,
        retry_base_s: float = config.DEFAULT_RETRY_BASE_S,
        retry_cap_s: float = config.DEFAULT_RETRY_CAP_S,
        metrics_port: int | None = None,
        metrics_addr: str = "0.0.0.0",
        stop_retry_s: float = config.DEFAULT_STOP_RETRY_S,
    ) -> None:
        for name, value, lo in (("concurrency", concurrency, 1), ("batch", batch, 1),
                                ("prefetch", prefetch, 1), ("lease_ms", lease_ms, 100)):
            if not isinstance(value, int) or value < lo:
                raise ConfigError(f"{name} must be an integer >= {lo}, got {value!r}")
        if idle_wait_s <= 0 or idle_wait_s >= config.DEFAULT_SOCKET_TIMEOUT_S:
            raise ConfigError("idle_wait_s must be positive and below the socket timeout")
        self._own_client = client is None
        if client is None:
            if url is None:
                raise ConfigError("give a Redis URL or a client")
            client = connect(url, max_connections=concurrency * 2 + 4)
        self.q = Queue(queue, client=client, retention_s=retention_s)
        self.redis = client
        self.scripts = self.q.scripts
        self.keys = self.q.keys
        self.handler = handler
        self.is_async = inspect.iscoroutinefunction(handler)
        self.concurrency = concurrency
        self.batch = batch
        self.prefetch = prefetch
        self.lease_ms = lease_ms
        self.heartbeat_s = heartbeat_s
        self.idle_wait_s = idle_wait_s
        self.ack_flush_s = ack_flush_s
        self.stop_retry_s = stop_retry_s
        #: tokens a stopping worker could not hand back (Redis unreachable)
        self.undrained = 0
        self.id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.stats = _Stats()
        self._stopping = threading.Event()
        self._held: set[str] = set()
        self._held_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started_ms = now_ms()
        self.retry_base_s = retry_base_s
        self.retry_cap_s = retry_cap_s
        #: per slot thread: the job and the entry ids it read and has not settled
        self._inflight: dict[int, dict[str, set[str]]] = {}
        fault = os.environ.get("STREAMQ_FAULT", "")
        point, _, count = fault.partition(":")
        self._fault_at = (point, int(count or 1)) if point else None
        self._fault_count = 0
        self.metrics = WorkerMetrics(queue)
        self._metrics_at = (metrics_port, metrics_addr)
        #: set when the worker stopped because Redis refused access
        self.fatal: str | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to drain and return from :meth:`run`."""
        self._stopping.set()

    def run(self) -> None:
        """Serve until :meth:`stop` (or SIGTERM/SIGINT when run in the main thread)."""
        ping(self.redis)  # fail fast, with a clear error, when Redis is unreachable at start
        port, addr = self._metrics_at
        if port is not None:
            self.metrics.serve(port, addr)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop())
        loop_thread = None
        if self.is_async:
            self._loop = asyncio.new_event_loop()
            loop_thread = threading.Thread(target=self._loop.run_forever, name="streamq-loop",
                                           daemon=True)
            loop_thread.start()
        try:
            self._heartbeat()
        except ACCESS_ERRORS as e:
            raise ConnectionFailed(f"Redis refused access: {e}") from None
        slots = [threading.Thread(target=self._slot, name=f"streamq-slot-{i}", daemon=True)
                 for i in range(self.concurrency)]
        for t in slots:
            t.start()
        log.info("worker %s serving queue %s with %d slots", self.id, self.q.name,
                 self.concurrency)
        # heartbeats (and lease extensions) go on while the slots drain
        while any(t.is_alive() for t in slots):
            self._stopping.wait(self.heartbeat_s)
            if self._stopping.is_set():
                for t in slots:
                    t.join(self.heartbeat_s / len(slots))
            try:
                self._heartbeat()
            except ACCESS_ERRORS as e:
                self._fatal(e)
            except CONNECTION_ERRORS as e:
                log.warning("heartbeat failed: %s", e)
        if self._loop is not None and loop_thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            loop_thread.join()
            self._loop.close()
        try:
            self.redis.zrem(self.keys.workers, self.id)
            self.redis.delete(self.keys.worker(self.id))
        except (*CONNECTION_ERRORS, *ACCESS_ERRORS) as e:
            log.warning("could not deregister: %s", e)
        if self._own_client:
            self.redis.close()
        log.info("worker %s stopped after %d sub-requests", self.id, self.stats.processed)
        if self.fatal is not None:
            raise ConnectionFailed(self.fatal)
        if self.undrained:
            raise ConnectionFailed(
                f"Redis unreachable for {self.stop_retry_s:g} s while stopping: "
                f"{self.undrained} token(s) left to expire (nothing is lost: the reaper hands "
                "their entries to other workers)")

    def _fatal(self, e: BaseException) -> None:
        """Access refused (wrong credentials, a command the ACL forbids): stop, do not retry."""
        if self.fatal is None:
            self.fatal = f"Redis refused access: {e}"
            log.error("%s; stopping", self.fatal)
        self._stopping.set()

    def _heartbeat(self) -> None:
        with self._held_lock:
            held = list(self._held)
        self.metrics.leases.set(len(held))
        lost = self.scripts.heartbeat(
            self.keys, self.id,
            heartbeat_ttl_ms=int(self.heartbeat_s * 3000),
            lease_ms=self.lease_ms,
            info_ttl_ms=int(self.heartbeat_s * 3000) + 60_000,
            info={"host": socket.gethostname(), "pid": os.getpid(), "started": self._started_ms,
                  "slots": self.concurrency, "processed": self.stats.processed,
                  "failed": self.stats.failed, "leases": len(held)},
            tokens=held,
        )
        self._refresh_entries()
        if lost:
            # a token settled meanwhile, or dropped because its job finished, is no loss
            with self._held_lock:
                lost = [t for t in lost if t in self._held]
            if lost:
                log.info("leases no longer held (job finished or lease expired): %s",
                         ", ".join(lost[:10]))

    # -- one slot ----------------------------------------------------------------------

    def _slot(self) -> None:
        settled: list[tuple[str, str]] = []
        #: jobs the last acknowledgements completed, finished with the next settle
        finishes: list[tuple[str, JobReply]] = []
        #: jobs whose last read was a full batch: their next batch is read in the round
        #: trip of the next settle, and served at once if that settle gives a token back
        follow: list[str] = []
        #: results of followed jobs, acknowledged first in the round trip of the next settle
        acks: list[_Batch] = []
        stop_seen: float | None = None
        while True:
            stopping = self._stopping.is_set()
            if stopping and not settled and not finishes and not acks:
                return  # nothing to hand back
            if stopping and stop_seen is None:
                stop_seen = time.monotonic()
            spec, follow = ([] if stopping else follow), []
            try:
                claimed, preread = self._settle(settled, finishes,
                                                0 if stopping else self.prefetch, spec, acks)
                with self._held_lock:
                    self._held.difference_update(t for t, _ in settled)
                    self._held.update(t for t, _ in claimed)
                settled = []
                if acks:
                    acks = []
                    self._fault("after_ack")
                if stopping:
                    return
                if not claimed:
                    self.redis.blpop([self.keys.wake], timeout=self.idle_wait_s)
                    continue
                # until the work is done, a failure releases the tokens on the next settle
                settled = [(t, "r") for t, _ in claimed]
                self._fault("after_claim")
                try:
                    settled, follow, acks = self._work([t for t, _ in claimed], finishes,
                                                       preread)
                finally:
                    with self._held_lock:
                        self._inflight.pop(threading.get_ident(), None)
                if not acks:
                    self._fault("after_ack")
            except ACCESS_ERRORS as e:
                self._fatal(e)
            except CONNECTION_ERRORS as e:
                if stop_seen is not None and time.monotonic() - stop_seen >= self.stop_retry_s:
                    log.error("redis unavailable while stopping (%s): leaving %d token(s) to "
                              "expire; the reaper hands their entries to other workers", e,
                              len(settled))
                    with self._held_lock:
                        self.undrained += len(settled)
                    return
                log.warning("redis unavailable (%s); retrying", e)
                self._pause(stopping)
            except Exception:
                log.exception("unexpected error in a worker slot; its tokens are released")
                self._pause(stopping)

    def _settle(self, settled: list[tuple[str, str]], finishes: list[tuple[str, JobReply]],
                claim: int, follow: Sequence[str] = (), acks: Sequence[_Batch] = ()
                ) -> tuple[list[tuple[str, float]], dict[str, Any]]:
        """Acknowledge ``acks``, finish the completed jobs in ``finishes``, settle the
        held tokens and claim up to ``claim`` new ones, then read the next batch of each
        job in ``follow``: one round trip. ``finishes`` is left holding the jobs those
        acknowledgements completed (finished with the next settle).

        Returns the claimed tokens and, for each followed job of which a token was
        claimed, its raw read. Entries read for a job of which no token was claimed
        (a more urgent job took the slot) are handed back at once, as a drain does.
        """
        calls = [self.scripts.ack_call(jk, done) for jk, done in acks]
        sent = len(finishes)
        if finishes:
            # finishing a job removes its tokens (now, or when it was finished before):
            # a token of a job finished here needs no drop of its own
            done = {job for job, _ in finishes}
            settled = [(t, m) for t, m in settled if m != "d" or token_job(t) not in done]
            calls.append(self.q.finish_many_call(finishes))
        calls.append(self.scripts.settle_call(self.keys, self.id, self.lease_ms, claim, settled))
        follow = list(dict.fromkeys(follow))  # one read per job: a second would be lost
        replies, reads = self.scripts.run_then(calls, [self._read(JobKeys(j)) for j in follow])
        del finishes[:sent]
        self._acked(acks, replies[: len(acks)], finishes)
        claimed = self.scripts.parse_settle(replies[-1])
        preread = dict(zip(follow, reads))
        if preread:
            held = {token_job(t) for t, _ in claimed}
            for job in [j for j in preread if j not in held]:
                read = preread.pop(job)
                entries = [] if isinstance(read, Exception) else _entries(read)
                if entries:
                    self._requeue(job, [e[0] for e in entries])
        return claimed, preread

    def _read(self, jk: JobKeys) -> tuple[Any, ...]:
        """The XREADGROUP of a job's next batch (new entries only, no blocking)."""
        return ("XREADGROUP", "GROUP", config.GROUP, self.id, "COUNT", self.batch, "STREAMS",
                jk.tasks, ">")

    def _pause(self, stopping: bool) -> None:
        """Wait before a retry: a second, cut short by a stop; half a second once stopping
        (the stop event is set then, so waiting on it would not pause at all)."""
        if stopping:
            time.sleep(0.5)
        else:
            self._stopping.wait(1.0)

    def _work(self, tokens: list[str], finishes: list[tuple[str, JobReply]],
              preread: dict[str, Any]
              ) -> tuple[list[tuple[str, str]], list[str], list[_Batch]]:
        """Serve the claimed tokens once (a job in ``preread`` was read already).

        Returns how to settle each token, the jobs to follow (read with the next
        settle: a full batch was read, so more is likely waiting), and the results
        left to acknowledge with the next settle: when every job with results left is
        followed, they go in that round trip, first; otherwise they are acknowledged
        here, and the jobs this completed are added to ``finishes``."""
        jks = [JobKeys(token_job(t)) for t in tokens]
        replies = [preread.pop(jk.job_id, _UNREAD) for jk in jks]
        # raw replies, turned into entries by _entries(); an error (NOGROUP: the job
        # finished meanwhile) is returned in place of its reply
        unread = [i for i, r in enumerate(replies) if r is _UNREAD]
        for i, reply in zip(unread, pipelined(self.redis, [self._read(jks[i]) for i in unread])):
            replies[i] = reply
        reads: list[Any] = [r if isinstance(r, Exception) else _entries(r) for r in replies]
        got = [(i, jk.job_id, [e[0].decode() for e in read])
               for i, (jk, read) in enumerate(zip(jks, reads))
               if read and not isinstance(read, Exception)]
        # everything read is kept fresh until settled
        held = self._track_many([(job, ids) for _, job, ids in got])
        for (i, _, ids), unacked in zip(got, held):
            reads[i] = (reads[i], ids, unacked)
        self._fault("after_read")
        settled: list[tuple[str, str]] = []
        follow: list[str] = []
        pending: list[tuple[int, JobKeys, list[tuple[str, int, bytes]]]] = []
        waits: list[float] = []  # metrics, added in one go before anything is acknowledged
        durations: list[float] = []
        for tok, jk, read in zip(tokens, jks, reads):
            if isinstance(read, redis.ResponseError) or not read:
                # no stream/group (job finished or gone) or nothing new: park, or drop when done
                settled.append((tok, self._idle_mode(jk.job_id)))
                continue
            if isinstance(read, Exception):
                raise read
            entries, ids, unacked = read
            done, completed = self._run_entries(jk, entries, ids, unacked, waits, durations)
            settled.append((tok, "d" if completed else "r"))
            if not completed and len(entries) >= self.batch and jk.job_id not in follow:
                follow.append(jk.job_id)  # once per job, however many of its tokens it holds
            if done:
                pending.append((len(settled) - 1, jk, done))
        self._observe(waits, durations)
        batches = [(jk, d) for _, jk, d in pending]
        if batches and not self._stopping.is_set() and all(
                jk.job_id in follow for jk, _ in batches):
            # followed jobs rarely complete on this ack: their tokens are released (r)
            # in the same round trip; one that did complete is finished with the settle
            # after, and the read-ahead of it finds its stream gone
            return settled, follow, batches
        # acknowledge what is left of every job in one round trip
        for (pos, _, _), ok in zip(pending, self._ack_many(batches, finishes)):
            if ok:
                settled[pos] = (settled[pos][0], "d")
                follow = [j for j in follow if j != token_job(settled[pos][0])]
        return settled, follow, []

    def _idle_mode(self, job: str) -> str:
        state: bytes | None = self.redis.hget(JobKeys(job).meta, "state")  # type: ignore[assignment]
        if state is None:
            return "d"  # the job is gone (expired, or never created): nothing to serve
        if state in (b"open", b"active"):
            moved, _ = self.scripts.promote_retries(JobKeys(job))
            return "r" if moved else "p"
        # terminal in its own slot: make sure the queue slot knows (idempotent)
        self._finish_from_meta(job)
        return "d"

    def _finish_from_meta(self, job: str) -> None:
        m = self.redis.hmget(JobKeys(job).meta, "state", "total", "done", "failed",
                             "concurrency", "dedup", "priority", "client", "created", "retention",
                             "incarnation")
        if m[0] is None:
            return
        reply = JobReply.parse([1, *m])
        call = self.q.finish_call(job, reply)
        self.scripts.run(call.name, call.keys, call.args)

    def _run_entries(
        self, jk: JobKeys, entries: list[Any], ids: list[str], unacked: set[str],
        waits: list[float], durations: list[float],
    ) -> tuple[list[tuple[str, int, bytes]], bool]:
        """Run a job's entries (``ids`` are their decoded ids, ``unacked`` the set
        heartbeats keep fresh) in order, acknowledging every ``ack_flush_s``. Queue
        waits and handler durations are added to ``waits`` and ``durations``, which
        go to the metrics before anything is acknowledged.

        Returns the results not yet acknowledged, and whether the job completed.
        """
        done: list[tuple[str, int, bytes]] = []
        flushed_at = time.perf_counter()
        completed = False
        job = jk.job_id
        queue, stopping, clock = self.q.name, self._stopping, time.perf_counter
        # wall-clock seconds = clock() + to_wall: an entry's queue wait (from the ms in its
        # id) is measured at its start without a second clock read per entry
        to_wall = time.time() - clock()
        handler, sync, flush_s = self.handler, self._loop is None, self.ack_flush_s
        faults = self._fault_at is not None
        for n, (_, flat) in enumerate(entries):
            if stopping.is_set():
                self._requeue(job, [e[0] for e in entries[n:]])
                break
            eid = ids[n]
            index: int | None
            if len(flat) == 6 and flat[0] == b"i" and flat[2] == b"t" and flat[4] == b"p":
                # the layout every first attempt has: read without building a dict
                kind, raw, attempt, suspect = flat[3], flat[5], 1, False
                try:
                    index = int(flat[1])
                except ValueError:
                    index = None
                if index is not None and index < 0:
                    index = None
            else:
                fields = _fields(flat)
                index = _int_field(fields, b"i")
                kind, raw = fields.get(b"t"), fields.get(b"p")
                attempt = 1 if b"a" not in fields else (_int_field(fields, b"a") or 0) + 1
                suspect = b"s" in fields
            try:
                if index is None:
                    raise PayloadError("missing or invalid index field 'i'")
                if kind is None or raw is None:
                    raise PayloadError("missing type 't' or payload 'p' field")
                payload = decode(kind, raw)
            except PayloadError as e:
                log.error("job %s entry %s is malformed: %s", job, eid, e)
                self._observe(waits, durations)
                completed = self._fail(job, eid, -1 if index is None else index, 1, -1,
                                       f"malformed entry: {e}", kind or b"b",
                                       raw or b"") or completed
                unacked.discard(eid)
                continue
            if suspect:
                # suspect (its worker died): acknowledge what is done, then record the
                # start, so a kill inside this handler counts an attempt for it alone
                if done:
                    self._observe(waits, durations)
                    completed = self._ack_many([(jk, done)])[0] or completed
                    unacked.difference_update(d[0] for d in done)
                    done = []
                self.redis.hset(jk.inflight, eid, self.id)
            if faults:
                self._fault("in_handler")
            started = clock()
            wait = started + to_wall - int(eid[:eid.find("-")]) / 1000
            waits.append(wait if wait > 0.0 else 0.0)
            task = (queue, job, index, eid, attempt)
            try:
                if sync:  # inline rather than a method call: this runs per sub-request
                    reset = _current.set(task)
                    try:
                        value = handler(payload)
                    finally:
                        _current.reset(reset)
                else:
                    value = self._call_async(task, payload)
                result = encode_result(value)
            except Exception as e:
                durations.append(clock() - started)
                self.metrics.failed.inc()
                with self.stats.lock:
                    self.stats.failed += 1
                delay = self._retry_delay(e, attempt)
                log.warning("job %s sub-request %d attempt %d failed: %s: %s", job, index,
                            attempt, type(e).__name__, e)
                self._observe(waits, durations)
                completed = self._fail(job, eid, index, attempt, delay,
                                       f"{type(e).__name__}: {e}", kind, raw) or completed
                unacked.discard(eid)
                continue
            ended = clock()
            durations.append(ended - started)
            done.append((eid, index, result))
            if ended - flushed_at >= flush_s:
                self._observe(waits, durations)
                completed = self._ack_many([(jk, done)])[0] or completed
                unacked.difference_update(d[0] for d in done)
                done = []
                flushed_at = clock()
        return done, completed

    def _observe(self, waits: list[float], durations: list[float]) -> None:
        """Add the gathered queue waits and handler durations to the histograms; empty
        both lists. Called before anything is acknowledged, so the metrics never lag
        behind a completion."""
        self.metrics.wait_seconds.observe_many(waits)
        self.metrics.handler_seconds.observe_many(durations)
        waits.clear()
        durations.clear()

    def _retry_delay(self, e: Exception, attempt: int) -> int:
        """Milliseconds until the next attempt, or -1 to dead-letter at once."""
        if isinstance(e, NonRetryable):
            return -1
        if isinstance(e, RetryLater):
            return max(0, int(e.delay_s * 1000))
        delay = min(self.retry_cap_s, self.retry_base_s * 2 ** (attempt - 1))
        return int(delay * 1000 * random.uniform(0.5, 1.0))

    def _fail(self, job: str, eid: str, index: int, attempts: int, delay_ms: int, error: str,
              kind: bytes, raw: bytes) -> bool:
        """Report a failed attempt; True when it completed the job."""
        call = self.scripts.fail_call(JobKeys(job), entry_id=eid, index=index,
                                      attempts=attempts, delay_ms=delay_ms, error=error[:2000],
                                      kind=kind, payload=raw)
        outcome, reply = self.scripts.parse_fail(self.scripts.run(call.name, call.keys, call.args))
        if outcome == 1:
            self.metrics.retried.inc()
        if outcome == 2:
            self.metrics.dead_lettered.inc()
            announce(self.redis, self.keys, job)
        if reply.completed:
            finish = self.q.finish_call(job, reply)
            self.scripts.run(finish.name, finish.keys, finish.args)
        return reply.completed

    def _track_many(self, reads: list[tuple[str, list[str]]]) -> list[set[str]]:
        """Register the entries a slot holds (job, entry ids), so heartbeats keep them
        fresh; return each job's set of them (the slot removes what it settles)."""
        out = []
        with self._held_lock:
            by_job = self._inflight.setdefault(threading.get_ident(), {})
            for job, ids in reads:
                unacked = by_job.setdefault(job, set())
                unacked.update(ids)
                out.append(unacked)
        return out

    def _refresh_entries(self) -> None:
        """Reset the idle time of every entry this worker holds (XCLAIM JUSTID:
        no delivery is counted), so the reaper never takes work from a live worker."""
        with self._held_lock:
            held = [(job, list(ids)) for by_job in self._inflight.values()
                    for job, ids in by_job.items() if ids]
        if not held:
            return
        pipe = self.redis.pipeline(transaction=False)
        for job, ids in held:
            pipe.xclaim(JobKeys(job).tasks, config.GROUP, self.id, 0, list[Any](ids), justid=True)
        pipe.execute(raise_on_error=False)

    def _fault(self, point: str) -> None:
        """Fault injection for crash tests (STREAMQ_FAULT=point:n kills on the n-th pass)."""
        if self._fault_at is not None and self._fault_at[0] == point:
            self._fault_count += 1
            if self._fault_count >= self._fault_at[1]:
                os.kill(os.getpid(), signal.SIGKILL)

    def _call_async(self, task: tuple[str, str, int, str, int], payload: Any) -> Any:
        """Run an ``async def`` handler on the worker's event loop; wait for its result.
        (Sync handlers are called inline in :meth:`_run_entries`.)"""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(self._acall(task, payload), self._loop).result()

    async def _acall(self, task: tuple[str, str, int, str, int], payload: Any) -> Any:
        _current.set(task)
        return await self.handler(payload)

    def _ack_many(self, batches: list[_Batch],
                  finishes: list[tuple[str, JobReply]] | None = None) -> list[bool]:
        """Acknowledge results of several jobs in one round trip; True for each job
        this completed. The completed jobs are added to ``finishes`` (finished with
        the slot's next settle), or, without it, finished at once in one more."""
        replies = self.scripts.run_many([self.scripts.ack_call(jk, done) for jk, done in batches])
        completed: list[tuple[str, JobReply]] = []
        out = self._acked(batches, replies, completed)
        if finishes is not None:
            finishes.extend(completed)
        elif completed:
            call = self.q.finish_many_call(completed)
            self.scripts.run(call.name, call.keys, call.args)
        return out

    def _acked(self, batches: Sequence[_Batch], replies: Sequence[Any],
               completed: list[tuple[str, JobReply]]) -> list[bool]:
        """Count the replies of ``ack`` calls; add the jobs they completed to
        ``completed``; True for each job completed."""
        out: list[bool] = []
        acked = 0
        for (jk, _), raw in zip(batches, replies):
            acked += int(raw[0])
            out.append(raw[1] == 1)
            if raw[1] == 1:
                completed.append((jk.job_id, JobReply.parse(raw[1:])))
        self.metrics.processed.inc(acked)
        with self.stats.lock:
            self.stats.processed += acked
        return out

    def _requeue(self, job: str, entry_ids: list[bytes]) -> None:
        moved = self.scripts.requeue(JobKeys(job), self.id, [e.decode() for e in entry_ids])
        log.info("draining: handed back %d unstarted entries of job %s", moved, job)
