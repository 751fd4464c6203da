"""Lease keeping: what each slot of a worker holds, and the heartbeat that keeps it.

Ownership is per slot: a token a slot claims is owned in Redis by
``<worker id>/<slot>`` (``owners``), and here by that slot's :class:`SlotHold`.
Only the slot itself adds or removes its tokens, so a token released by one
slot and claimed by another slot of the same worker is never dropped from the
second slot's hold. The main thread's heartbeat extends every lease a slot
still owns and resets the idle time of every entry a slot read and has not
settled, or whose result waits for an acknowledgement a later round trip
carries (``XCLAIM ... JUSTID``), so the reaper never takes work from a live
worker. It also notes the cancelled jobs among those the slots hold entries
of (small jobs included) or sent reads of lately
(:meth:`LeaseKeeper.see_cancels`), and drops the
entries of cancelled small jobs pending with the worker that no slot saw
(:mod:`streamq.lane_unseen`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from streamq.base import cancels, config
from streamq.base.entry_fields import _lane_fields
from streamq.base.keys import QueueKeys
from streamq.work.lane_unseen import UnseenLaneEntries, UnseenWorker, lane_cancelled

if TYPE_CHECKING:
    from streamq.base.governor import Governor
    from streamq.base.metrics import WorkerMetrics, WorkerStats
    from streamq.services.history import ActivityCounter

log = logging.getLogger("streamq.worker")

#: How long a job a slot sent a read of stays watched for a cancel, seconds. A read
#: whose reply was lost delivered entries the worker never sees: they stay pending with
#: it until the reaper hands them on (after its ``min_idle``), and a cancel meanwhile
#: waits for this worker to list the job.
READ_WATCH_S = 2 * config.DEFAULT_MIN_IDLE_S
#: Jobs watched at most (the least recently read forgotten first).
READ_WATCH_MAX = 10_000


class SlotHold:
    """The tokens one slot holds and the entries it read and has not settled; changed
    only by that slot, under the keeper's lock."""

    def __init__(self, index: int) -> None:
        self.index = index
        #: the queue shard of the tokens (None: the queue's first)
        self.shard: QueueKeys | None = None
        self.tokens: set[str] = set()
        #: job id -> entry ids read and not yet settled
        self.entries: dict[str, set[str]] = {}
        #: job id or lane stream -> entry ids whose results wait for an acknowledgement
        #: sent with a later round trip (kept fresh until it went through)
        self.acking: dict[str, set[str]] = {}
        #: (lane stream, entry id) -> the fields of a lane entry in :attr:`entries`
        #: (a lane's entries are kept by stream: their small jobs are read from these)
        self.lane_jobs: dict[tuple[str, str], list[bytes]] = {}


class LeasingWorker(UnseenWorker, Protocol):
    """What the lease keeper and its heartbeat read of their worker."""

    @property
    def keys(self) -> QueueKeys: ...
    @property
    def shards(self) -> list[QueueKeys]: ...
    @property
    def slots(self) -> int: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def lease_ms(self) -> int: ...
    @property
    def info_ttl_ms(self) -> int: ...
    @property
    def started_ms(self) -> int: ...
    @property
    def governor(self) -> Governor | None: ...
    @property
    def metrics(self) -> WorkerMetrics: ...
    @property
    def activity(self) -> ActivityCounter: ...
    @property
    def stats(self) -> WorkerStats: ...


class LeaseKeeper:
    """The holds of a worker's slots, and its heartbeat."""

    def __init__(self, worker: LeasingWorker) -> None:
        self.w = worker
        self.lock = threading.Lock()
        self.holds = [SlotHold(i) for i in range(worker.slots)]
        #: job id -> monotonic time a slot last sent a read of it (see READ_WATCH_S)
        self.reads: dict[str, float] = {}
        #: the lane streams the slots read lately, and their entries held unseen
        self.unseen = UnseenLaneEntries(self)
        #: the cancelled jobs the slots held entries of at the last beat (listed)
        self.held_cancelled: list[str] = []

    # -- slot side ----------------------------------------------------------------

    def settled(self, hold: SlotHold, released: list[str], claimed: list[str],
                shard: QueueKeys) -> None:
        """A settle of ``hold``'s slot released ``released`` and claimed ``claimed``
        (which are tokens of ``shard``)."""
        with self.lock:
            hold.shard = shard
            hold.tokens.difference_update(released)
            hold.tokens.update(claimed)

    def track(self, hold: SlotHold, reads: list[tuple[str, list[str]]],
              lane_jobs: dict[tuple[str, str], list[bytes]] | None = None
              ) -> list[set[str]]:
        """Register entries a slot read (job or lane stream, entry ids), so heartbeats
        keep them fresh; return each one's set of them (the slot removes what it
        settles). ``lane_jobs``: the fields of each lane entry (stream, id), whose small
        job's cancel the beat looks for."""
        out = []
        with self.lock:
            for job, ids in reads:
                unacked = hold.entries.setdefault(job, set())
                unacked.update(ids)
                out.append(unacked)
            if lane_jobs:
                hold.lane_jobs.update(lane_jobs)
        return out

    def untrack(self, hold: SlotHold) -> None:
        """The slot settled (or handed back) every entry it read."""
        with self.lock:
            hold.entries.clear()
            hold.lane_jobs.clear()

    def reading(self, job: str) -> None:
        """A slot sends a read of ``job``: watched for a cancel for READ_WATCH_S."""
        with self.lock:
            self.reads.pop(job, None)
            self.reads[job] = time.monotonic()
            if len(self.reads) > READ_WATCH_MAX:
                del self.reads[next(iter(self.reads))]

    def awaiting(self, hold: SlotHold, items: list[tuple[str, list[str]]]) -> None:
        """Entries whose results wait for an acknowledgement (job id or lane stream,
        entry ids): kept fresh by heartbeats until :meth:`landed`, however long the
        round trip that carries it takes to go through (a round's end untracks only
        what it read)."""
        with self.lock:
            for key, ids in items:
                hold.acking.setdefault(key, set()).update(ids)

    def landed(self, hold: SlotHold, items: list[tuple[str, list[str]]]) -> None:
        """The acknowledgements of :meth:`awaiting`'s entries went through."""
        with self.lock:
            for key, ids in items:
                left = hold.acking.get(key)
                if left is not None:
                    left.difference_update(ids)
                    if not left:
                        del hold.acking[key]

    def discard(self, unacked: set[str], ids: Any) -> None:
        with self.lock:
            unacked.difference_update(ids)

    # -- main thread ----------------------------------------------------------------

    def held(self) -> list[tuple[str, int]]:
        """Every token a slot holds, with its slot."""
        with self.lock:
            return [(t, h.index) for h in self.holds for t in h.tokens]

    def held_by_shard(self) -> dict[QueueKeys, list[tuple[str, int]]]:
        """The tokens the slots hold, with their slot, by shard (every shard listed)."""
        w = self.w
        out: dict[QueueKeys, list[tuple[str, int]]] = {qk: [] for qk in w.shards}
        with self.lock:
            for h in self.holds:
                out.setdefault(h.shard or w.keys, []).extend((t, h.index) for t in h.tokens)
        return out

    def heartbeat(self) -> None:
        """Beat: refresh the registry and extend the leases the slots still own (on
        every shard of the queue); then refresh the entries they hold."""
        w = self.w
        by_shard = self.held_by_shard()
        count = sum(len(v) for v in by_shard.values())
        w.metrics.leases.set(count)
        lost: list[str] = []
        # what the slots did since the last counted beat: carried by the first shard's
        # beat, and the same batch again until one carrying it succeeds
        stats = w.activity.batch()
        try:
            self.see_cancels()
            self.unseen.drop_cancelled()
            # listed after they were noted, but those a slot is about to start
            # (:mod:`streamq.base.cancels`)
            noted = ",".join(cancels.listable(list(dict.fromkeys(
                [*cancels.recent(), *self.held_cancelled]))))
            for qk, held in by_shard.items():
                first = qk == w.keys
                lost += w.scripts.heartbeat(
                    qk, w.id,
                    heartbeat_ttl_ms=int(w.heartbeat_s * 3000),
                    lease_ms=w.lease_ms,
                    info_ttl_ms=w.info_ttl_ms,
                    info={"host": socket.gethostname(), "pid": os.getpid(),
                          "started": w.started_ms, "slots": w.concurrency,
                          # how many of the slots the governor lets serve now (all of
                          # them for a worker given --concurrency, or async)
                          "serving": (w.concurrency if w.governor is None
                                      else w.governor.active),
                          "processed": w.stats.processed, "failed": w.stats.failed,
                          "leases": len(held),
                          "cancels": noted},
                    tokens=held,
                    stats=stats if first else None,
                )
                if first and stats is not None:
                    w.activity.sent()
        finally:
            # also when the beat failed: under OOM the script's writes are refused but
            # XCLAIM is not, and fresh entries are not taken from a live worker
            self.refresh_entries()
        if lost:
            # a token settled meanwhile, or dropped because its job finished, is no loss
            still = {t for t, _ in self.held()}
            lost = [t for t in lost if t in still]
            if lost:
                log.info("leases no longer held (job finished or lease expired): %s",
                         ", ".join(lost[:10]))

    def see_cancels(self) -> None:
        """Read the state of every job whose entries the slots hold (a small job's
        record, for a lane entry), and of every live job a slot sent a read of lately (a
        read whose reply was lost left entries pending with this worker that it never
        saw), and note the cancelled ones (:mod:`streamq.cancels`): a slot starts no
        more of their entries. The beat lists in the worker's hash (``cancels``) the
        newest it noted and every cancelled job the slots hold entries of (however many
        were cancelled since), which is what ``Queue.cancel`` waits for. A watched job
        found finished or gone is no longer watched (it can no longer be cancelled)."""
        with self.lock:
            held = {job for h in self.holds for job, ids in h.entries.items()
                    if ids and "{" not in job}  # small-job lanes are keyed by stream
            small = self._held_small()
            cut = time.monotonic() - READ_WATCH_S
            for job in [j for j, at in self.reads.items() if at < cut]:
                del self.reads[job]
            watched = [j for j in self.reads if j not in held and not cancels.seen(j)]
        jobs = sorted(held) + watched
        unseen = [(qk, job) for qk, job in small if not cancels.seen(job)]
        if jobs or unseen:
            pipe = self.w.redis.pipeline(transaction=False)
            for job in jobs:
                pipe.hget(self.w.keys.job(job).meta, "state")
            for qk, job in unseen:
                pipe.hget(qk.ljobs, job)
            replies = pipe.execute(raise_on_error=False)
            states, records = replies[:len(jobs)], replies[len(jobs):]
            cancels.add([job for job, state in zip(jobs, states) if state == b"cancelled"] +
                        [job for (_, job), raw in zip(unseen, records) if lane_cancelled(raw)])
            ended = [job for job, state in zip(watched, states[len(held):])
                     if not isinstance(state, Exception)
                     and state not in (b"open", b"active", b"cancelled")]  # None: gone
            with self.lock:
                for job in ended:
                    self.reads.pop(job, None)
        # what the beat lists besides the newest: every cancelled job the slots hold
        # entries of, however many were cancelled since (a canceller waits for it)
        self.held_cancelled = [job for job in [*held, *(job for _, job in small)]
                               if cancels.seen(job)]

    def _held_small(self) -> list[tuple[QueueKeys, str]]:
        """The small jobs (shard, job id) of the lane entries the slots hold; lane
        entries settled since are forgotten (under the lock)."""
        tags = {qk.tag: qk for qk in self.w.shards}
        out: dict[tuple[str, str], QueueKeys] = {}
        for h in self.holds:
            for (stream, eid), flat in list(h.lane_jobs.items()):
                if eid not in h.entries.get(stream, ()):
                    del h.lane_jobs[(stream, eid)]
                    continue
                job = _lane_fields(flat)[0]
                qk = tags.get(stream[4:stream.find("}")])
                if job and qk is not None:
                    out[(qk.tag, job)] = qk
        return [(qk, job) for (_, job), qk in out.items()]

    def refresh_entries(self) -> None:
        """Reset the idle time of every entry the slots hold, read or with its result
        waiting for an acknowledgement (XCLAIM JUSTID: no delivery is counted), so the
        reaper never takes work from a live worker."""
        with self.lock:
            held = [(job, list(ids)) for h in self.holds
                    for kept in (h.entries, h.acking) for job, ids in kept.items() if ids]
        if not held:
            return
        pipe = self.w.redis.pipeline(transaction=False)
        for job, ids in held:
            # a small-job lane's entries are held by stream key ("{" is in no job id)
            stream = job if "{" in job else self.w.keys.job(job).tasks
            pipe.xclaim(stream, config.GROUP, self.w.id, 0, list[Any](ids), justid=True)
        pipe.execute(raise_on_error=False)
