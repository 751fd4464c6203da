"""Running entries: the handler call per sub-request, in the slot's thread (sync
handlers) or through :mod:`streamq.work.async_entries`, with acknowledgements every
``ack_flush_s`` and a slow handler's batch handed back to other slots. A job's own
stream and the small-job lane are run alike: what differs is their source
(:mod:`streamq.work.sources`).

One :class:`EntryRunner` per worker, shared by its slots (it keeps no per-slot state
but the slow mark of each slot's thread). What became of each entry is reported
through :mod:`streamq.outcomes`.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from streamq.base import cancels, config, hooks
from streamq.base.codec import encode_result
from streamq.base.entry_fields import _checked, queued_s
from streamq.base.running import current as _current
from streamq.errors import PayloadError
from streamq.work.async_entries import AsyncEntries, AsyncWorker
from streamq.work.sources import Done, Read, Source, report_failure, report_malformed

if TYPE_CHECKING:
    from streamq.base.governor import Governor
    from streamq.services.watchdog import Watchdog

class EntryWorker(AsyncWorker, Protocol):
    """What running a job's entries reads of the worker."""

    @property
    def ack_flush_s(self) -> float: ...
    @property
    def watchdog(self) -> Watchdog: ...
    @property
    def governor(self) -> Governor | None: ...
    @property
    def async_entries(self) -> AsyncEntries: ...


class EntryRunner:
    """Runs the entries a slot read, acknowledging results as it goes: a job's own
    stream's and the small-job lane's alike (:mod:`streamq.work.sources`)."""

    def __init__(self, worker: EntryWorker) -> None:
        self.w = worker
        #: per slot thread: whether its round handed entries back behind a slow handler
        self._slow = threading.local()
        #: monotonic time entries were last handed back behind a slow handler (any slot)
        self.slow_at = float("-inf")

    def run_entries(self, src: Source, entries: list[Read], ids: list[str],
                    waits: list[float], durations: list[float]) -> tuple[list[Done], bool]:
        """Run a batch's entries (``ids`` are their decoded ids) in order, acknowledging
        every ``ack_flush_s``. Queue waits and handler durations are added to ``waits``
        and ``durations``, which go to the metrics before anything is acknowledged.

        Returns the results not yet acknowledged, and whether a job of a token completed
        (its token is dropped)."""
        try:
            return self._run(src, entries, ids, waits, durations)
        finally:  # however the batch ended, this thread is starting nothing
            cancels.started(threading.get_ident())

    def _run(self, src: Source, entries: list[Read], ids: list[str],
             waits: list[float], durations: list[float]) -> tuple[list[Done], bool]:
        """:meth:`run_entries`, with this thread noted as starting each entry's job from
        its check of the cancels to its handler's call (:mod:`streamq.base.cancels`)."""
        w, out = self.w, self.w.outcomes
        done: list[Done] = []
        completed = slow = False  # slow: the last handler took SLOW_ENTRY_S or more
        queue, stopping, fields, limit = w.q.name, w.stopping, src.fields, src.limit
        me, begin, starts = threading.get_ident(), cancels.begin, cancels.started
        handler, sync, flush_s, faults, clock = (w.handler, w.loop is None, w.ack_flush_s,
                                                 hooks.active(), time.perf_counter)
        # wall-clock s = clock() + to_wall: a queue wait without a second clock read per entry
        to_wall, flushed_at = self._begin(src, entries, ids)
        for n, (_, flat) in enumerate(entries):
            if n and slow or stopping.is_set():
                self._cut(src, entries[n:])
                break
            eid = ids[n]
            job, index, kind, raw, attempt, suspect = fields(flat)
            try:
                index, kind, raw, payload = _checked(job, index, kind, raw)
            except PayloadError as e:
                out.observe(waits, durations)
                completed = report_malformed(src, eid, job, (index, kind, raw), e) or completed
                continue
            if begin(job, me) or suspect:  # (begin first: it notes the job as starting)
                go = self._gate(src, eid, job, suspect, entries[n:], (done, waits, durations))
                completed = go[1] or completed
                if go[0] is None:
                    break
                if not go[0]:
                    continue
            if faults:
                hooks.at("in_handler")
            started = clock()
            wait = started + to_wall - queued_s(eid, flat)
            waits.append(wait if wait > 0.0 else 0.0)
            task: tuple[Any, ...] = (queue, job, index, eid, attempt) if limit is None else (
                queue, job, index, eid, attempt, started + to_wall + limit)
            starts(me)  # the handler is called now: a beat may list its job
            try:
                if sync:  # inline rather than a method call: this runs per sub-request
                    reset = _current.set(task)
                    try:  # with a timeout: given up at the deadline (HandlerTimeout)
                        value = (handler(payload) if limit is None
                                 else w.watchdog.call(handler, payload, limit, started + limit))
                    finally:
                        _current.reset(reset)
                else:
                    value = w.async_entries.call(task, payload, limit, started)
                result = encode_result(value)
            except Exception as e:
                durations.append(clock() - started)
                slow = durations[-1] >= config.SLOW_ENTRY_S
                out.observe(waits, durations)
                completed = report_failure(out, src, (eid, job, index, attempt, kind, raw), e) or completed
                continue
            durations.append(took := clock() - started)
            slow = took >= config.SLOW_ENTRY_S
            done.append((eid, index, result))
            if started + took - flushed_at >= flush_s:
                out.observe(waits, durations)
                completed = src.flush(done) or completed
                flushed_at = clock()
        return done, completed

    def _begin(self, src: Source, entries: list[Read], ids: list[str]) -> tuple[float, float]:
        """Before a batch runs: the offset from the perf counter to the wall clock and
        the perf counter now; the batch noted for tracing."""
        w = self.w
        if w.tracer is not None:
            w.tracer.note([(src.fields(e[1])[0], i) for e, i in zip(entries, ids)],
                          [e[1] for e in entries])
        now = time.perf_counter()
        return time.time() - now, now

    def _cut(self, src: Source, rest: list[Read]) -> None:
        """The rest of a batch is not started: handed back when the worker stops, else
        it waits behind a slow handler and goes back for other slots and workers to
        take now (no delivery spent)."""
        if self.w.stopping.is_set():
            src.hand_back(rest)
        else:
            src.behind_slow(rest)
            self.backlog(len(rest))

    @staticmethod
    def _cancelled(src: Source, rest: list[Read], job: str) -> bool:
        """``job`` was cancelled: its entries in ``rest`` are handed back (dropped, as a
        cancel asks) and none starts; True when nothing else is left in ``rest``."""
        mine = src.of_job(rest, job)
        src.hand_back(mine)
        return len(mine) == len(rest)

    def _gate(self, src: Source, eid: str, job: str, suspect: bool, rest: list[Read],
              gathered: tuple[list[Done], list[float], list[float]]
              ) -> tuple[bool | None, bool]:
        """Before an entry of a cancelled job, or a suspect entry (its worker died, or a
        small job's retry), runs. A cancelled job's entries are handed back (dropped, as
        the cancel asks). A suspect entry: what is done is acknowledged first, then its
        start recorded, so a kill inside its handler counts an attempt for it alone.
        ``gathered``: the results and metrics not yet acknowledged.

        Returns whether to run it (True; False when it was settled meanwhile, or its job
        was cancelled while the batch holds other jobs' entries; None when the batch
        holds nothing else: a cancel reported complete meanwhile, so nothing of its job
        starts), and whether the acknowledgement completed a job of a token."""
        if not suspect or cancels.seen(job):
            return (None if self._cancelled(src, rest, job) else False), False
        done, waits, durations = gathered
        completed = False
        if done:
            self.w.outcomes.observe(waits, durations)
            completed = src.flush(done)
        if not src.start(eid):
            src.settled(eid)
            return False, completed
        if cancels.seen(job):
            return (None if self._cancelled(src, rest, job) else False), completed
        return True, completed

    def backlog(self, waiting: int) -> None:
        """``waiting`` entries waited behind a slow handler and were handed back: the
        slots of this worker read and claim one at a time for a while, and a governed
        worker serves as many more slots at once as there are entries waiting."""
        self._slow.seen = True
        self.slow_at = time.monotonic()
        if self.w.governor is not None:
            self.w.governor.backlog(waiting)

    def recently_slow(self) -> bool:
        """Whether any slot handed entries back behind a slow handler lately."""
        return time.monotonic() - self.slow_at < config.SLOW_MEMORY_S

    def slow_now(self) -> bool:
        """Whether the calling slot's round handed entries back so far (not cleared)."""
        return bool(getattr(self._slow, "seen", False))

    def slowed(self) -> bool:
        """Whether the calling slot's round handed entries back behind a slow handler
        since it last asked (its next read and claim then take one at a time)."""
        seen = getattr(self._slow, "seen", False)
        self._slow.seen = False
        return bool(seen)

