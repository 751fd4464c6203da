"""Entries of small jobs a worker holds but never saw, and the cancels they hold up.

A lane read whose reply was lost (the client's resend reads the next entries)
delivered entries to the worker's consumer that the worker never sees: they
stay pending with it until the reaper hands them on after its ``min_idle``. A
cancel of such a small job waits for that worker to list the job or settle the
entry, and the worker, which tracks no such entry, would do neither: the cancel
would wait its whole timeout.

So the heartbeat, for every lane stream a slot sent a read of in the last
:data:`WATCH_S`, lists the entries pending with this worker's consumer that
were not refreshed since the last beat (XPENDING ... IDLE, one pipelined call per
stream) and that no slot tracks (read and not settled, or with a result waiting
for its acknowledgement: the slots' holds). Of those, the entries of cancelled
small jobs are dropped: acknowledged and deleted by ``lane_requeue``, which in
one script checks that each is still pending with this consumer and that its job
is no longer active (never copied back: a cancelled job stays cancelled).

Nothing of a cancelled job starts after that: an entry can be untracked while a
slot is about to run it (the reply of the settle that read it came back, and
the slot has not run its entries yet). Under the keeper's lock, the beat checks
again that no slot tracks the entries and adds their jobs to the process's
cancelled set (:mod:`streamq.cancels`) before it drops them; a slot tracks the
entries it runs under that lock and checks that set after (``LaneWork.run``),
so it either tracked an entry first (the beat leaves it alone) or sees its job
cancelled and does not start it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import redis

from streamq.base import cancels, config
from streamq.base.keys import QueueKeys
from streamq.model.queue_view import Serving

log = logging.getLogger("streamq.worker")

#: How long a lane stream a slot sent a read of stays watched, seconds (as the job
#: lane's READ_WATCH_S): twice the default ``min_idle``, after which the reaper has
#: handed such entries on.
WATCH_S = 2 * config.DEFAULT_MIN_IDLE_S
#: Streams watched at most (the least recently read forgotten first).
WATCH_MAX = 10_000
#: Pending entries listed per stream and beat (the next beat goes on from the last).
PAGE = 100


class UnseenWorker(Serving, Protocol):
    """What the pass reads of the worker: :class:`Serving`, and its beat."""

    @property
    def heartbeat_s(self) -> float: ...


class Held(Protocol):
    """What one slot tracks (:class:`streamq.leases.SlotHold`)."""

    @property
    def entries(self) -> dict[str, set[str]]: ...
    @property
    def acking(self) -> dict[str, set[str]]: ...


class Keeper(Protocol):
    """What the pass reads of the worker's lease keeper."""

    @property
    def lock(self) -> threading.Lock: ...
    @property
    def holds(self) -> Sequence[Held]: ...
    @property
    def w(self) -> UnseenWorker: ...


class UnseenLaneEntries:
    """The lane streams a worker's slots read lately, and the beat's drop of the
    entries of cancelled small jobs pending with the worker that no slot tracks."""

    def __init__(self, keeper: Keeper) -> None:
        self.k = keeper
        #: lane stream -> (its shard, monotonic time a slot last sent a read of it)
        self.reads: dict[str, tuple[QueueKeys, float]] = {}
        #: lane stream -> where the next listing of its pending entries starts
        self.cursor: dict[str, str] = {}

    def reading(self, qk: QueueKeys, streams: Sequence[str]) -> None:
        """A slot sends a read of lane ``streams`` of shard ``qk``."""
        now = time.monotonic()
        with self.k.lock:
            for stream in streams:
                self.reads.pop(stream, None)
                self.reads[stream] = (qk, now)
            while len(self.reads) > WATCH_MAX:
                self.cursor.pop(next(iter(self.reads)), None)
                del self.reads[next(iter(self.reads))]

    def _tracked(self) -> dict[str, set[str]]:
        """Lane stream -> the entry ids the slots track (call under the keeper's lock)."""
        out: dict[str, set[str]] = {}
        for h in self.k.holds:
            for kept in (h.entries, h.acking):
                for key, ids in kept.items():
                    if "{" in key:  # a lane stream (a job lane's are keyed by job id)
                        out.setdefault(key, set()).update(ids)
        return out

    def drop_cancelled(self) -> None:
        """One beat's pass (see the module): drop the entries of cancelled small jobs
        pending with this worker that no slot tracks."""
        w = self.k.w
        with self.k.lock:
            cut = time.monotonic() - WATCH_S
            for stream in [s for s, (_, at) in self.reads.items() if at < cut]:
                del self.reads[stream]
                self.cursor.pop(stream, None)
            watched = [(s, qk, self.cursor.get(s, "-")) for s, (qk, _) in self.reads.items()]
            tracked = self._tracked()
        if not watched:
            return
        idle = max(1, int(w.heartbeat_s * 1000))  # not refreshed by the last beat
        pipe = w.redis.pipeline(transaction=False)
        for stream, _, start in watched:
            pipe.xpending_range(stream, config.GROUP, start, "+", PAGE, consumername=w.id,
                                idle=idle)
        listed = pipe.execute(raise_on_error=False)
        found: list[tuple[str, QueueKeys, str]] = []
        with self.k.lock:
            for (stream, qk, _), rows in zip(watched, listed):
                if isinstance(rows, Exception):
                    continue  # the stream (or its group) is gone
                ids = [_text(row["message_id"]) for row in rows]
                if len(ids) >= PAGE:
                    self.cursor[stream] = "(" + ids[-1]
                else:
                    self.cursor.pop(stream, None)
                found += [(stream, qk, eid) for eid in ids
                          if eid not in tracked.get(stream, ())]
        if found:
            self._drop(found)

    def _drop(self, found: list[tuple[str, QueueKeys, str]]) -> None:
        """Drop those of the entries ``found`` (stream, shard, id) whose jobs are
        cancelled, unless a slot tracks them by now."""
        w = self.k.w
        jobs = _jobs(w.redis, [(stream, eid) for stream, _, eid in found])
        pipe = w.redis.pipeline(transaction=False)
        for (_, qk, _), job in zip(found, jobs):
            pipe.hget(qk.ljobs, job or "-")
        records = pipe.execute(raise_on_error=False)
        drop = [(stream, qk, eid, job) for (stream, qk, eid), job, raw
                in zip(found, jobs, records) if job and lane_cancelled(raw)]
        if not drop:
            return
        with self.k.lock:
            tracked = self._tracked()
            drop = [d for d in drop if d[2] not in tracked.get(d[0], ())]
            # before the drop: a slot that tracks one of them from now on sees its job
            # cancelled and does not start it
            cancels.add([job for _, _, _, job in drop])
        if not drop:
            return
        by_stream: dict[str, tuple[QueueKeys, list[str]]] = {}
        for stream, qk, eid, _ in drop:
            by_stream.setdefault(stream, (qk, []))[1].append(eid)
        for stream, (qk, ids) in by_stream.items():
            try:
                w.scripts.run("lane_requeue", (stream, qk.ljobs), [config.GROUP, w.id, *ids])
            except redis.ResponseError as e:  # refused: the beat goes on; the next tries again
                log.warning("could not drop unseen entries of cancelled small jobs: %s", e)
                return
        log.info("dropped %d entries of cancelled small jobs this worker held unseen "
                 "(a read whose reply was lost): %s", len(drop),
                 ", ".join(d[3] for d in drop[:10]))


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _jobs(client: Any, entries: list[tuple[str, str]]) -> list[str]:
    """The job id of each lane entry (stream, id); "" for one gone or without a job."""
    pipe = client.pipeline(transaction=False)
    for stream, eid in entries:
        pipe.xrange(stream, eid, eid)
    out = []
    for got in pipe.execute(raise_on_error=False):
        fields = got[0][1] if got and not isinstance(got, Exception) else {}
        out.append(_text(fields.get(b"j") or fields.get("j") or ""))
    return out


def lane_cancelled(raw: Any) -> bool:
    """Whether a small job's record (raw, or None) says it is cancelled (a short record
    is a job that succeeded: lua/includes/lane_complete.lua)."""
    if raw is None or isinstance(raw, Exception) or raw[:1] == b"S":
        return False
    try:
        return bool(json.loads(raw).get("state") == "cancelled")
    except ValueError:
        return False
