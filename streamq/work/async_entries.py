"""Running the entries of an ``async def`` handler on the worker's event loop thread:
several groups at once (a claimed token's batch of its job, one runner per token, so a
job never has more running than its tokens; or the small jobs of a lane read, one
each), or one call for a slot that runs one entry at a time.
Each run is bounded by its job's timeout, a handler that ignores its cancellation
included (:func:`streamq.watchdog.guarded`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from streamq.base import cancels, hooks
from streamq.base.codec import encode_result
from streamq.base.entry_fields import _checked, queued_s
from streamq.base.running import current as _current
from streamq.errors import HandlerTimeout, PayloadError
from streamq.services.watchdog import CANCEL_GRACE_S, guarded
from streamq.work.sources import (
    Done,
    Read,
    Source,
    SourceWorker,
    report_failure,
    report_malformed,
)

if TYPE_CHECKING:
    from streamq.services.watchdog import Timeouts

#: an entry ready to run: entry id, index, type, raw payload, attempt, decoded payload, job
#: (entry id, index, type, payload bytes, attempt, payload, job, queued: entry_fields.queued_s)
_Item = tuple[str, int, bytes, bytes, int, Any, str, float]
#: how an async run of one entry ended: (ok, value or exception, started, ended), or
#: None when it was not started (the worker is stopping)
_Outcome = tuple[bool, Any, float, float] | None
#: what one group's run gives back: results not yet acknowledged, and whether a job of
#: a token completed
Ran = tuple[list[Done], bool]


class AsyncWorker(SourceWorker, Protocol):
    """What running an ``async def`` handler reads of the worker."""

    @property
    def handler(self) -> Callable[[Any], Any]: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...
    @property
    def timeouts(self) -> Timeouts: ...


class AsyncEntries:
    """Runs entries through the worker's ``async def`` handler."""

    def __init__(self, worker: AsyncWorker) -> None:
        self.w = worker

    def run(self, groups: list[tuple[Source, list[Read], list[str]]],
            waits: list[float], durations: list[float], share: int) -> list[Ran]:
        """Run several groups of entries on the worker's event loop: each group's in
        order, up to ``share`` groups at once. A group is a claimed token's batch of its
        job (so a job never runs more at once than its tokens) or one small job's entry;
        its source (:mod:`streamq.work.sources`) is what the entries are reported to. No
        entry may be suspect (those run alone, through
        :meth:`streamq.work.entries.EntryRunner.run_entries`).

        Returns, per group, the results not yet acknowledged and whether a job of a
        token completed (a failure can complete it)."""
        w = self.w
        assert w.loop is not None
        out: list[Ran] = []
        items: list[list[_Item]] = []
        for src, entries, ids in groups:
            if w.tracer is not None:
                w.tracer.note([(src.fields(e[1])[0], i) for e, i in zip(entries, ids)],
                              [e[1] for e in entries])
            ready, completed = self._ready(src, entries, ids)
            items.append(ready)
            out.append(([], completed))
        tasks = [[(w.q.name, it[6], it[1], it[0], it[4]) for it in ready] for ready in items]
        ran = asyncio.run_coroutine_threadsafe(
            self._run_groups(tasks, [[it[5] for it in ready] for ready in items],
                             [src.limit for src, _, _ in groups], share),
            w.loop).result()
        for k, ((src, entries, _), ready, outcomes) in enumerate(zip(groups, items, ran)):
            out[k] = self._settle(src, entries, ready, outcomes, out[k], waits, durations)
        return out

    def _ready(self, src: Source, entries: list[Read], ids: list[str]
               ) -> tuple[list[_Item], bool]:
        """A group's entries parsed for running; a malformed one is dead-lettered (True
        when that completed a job of a token)."""
        ready: list[_Item] = []
        completed = False
        for n, (_, flat) in enumerate(entries):
            job, index, kind, raw, attempt, _suspect = src.fields(flat)
            try:
                index, kind, raw, payload = _checked(job, index, kind, raw)
                ready.append((ids[n], index, kind, raw, attempt, payload, job,
                              queued_s(ids[n], flat)))
            except PayloadError as e:
                completed = report_malformed(src, ids[n], job, (index, kind, raw),
                                             e) or completed
        return ready, completed

    def _settle(self, src: Source, entries: list[Read], ready: list[_Item],
                outcomes: list[_Outcome], before: Ran, waits: list[float],
                durations: list[float]) -> Ran:
        """What a group's runs gave: results to acknowledge, failures reported, the
        entries never started handed back."""
        out = self.w.outcomes
        done, completed = before
        to_wall = time.time() - time.perf_counter()
        unstarted = {it[0] for it, o in zip(ready, outcomes) if o is None}
        for (eid, index, kind, raw, attempt, _, job, queued), outcome in zip(ready, outcomes):
            if outcome is None:
                continue
            ok, value, started, ended = outcome
            wait = started + to_wall - queued
            waits.append(wait if wait > 0.0 else 0.0)
            durations.append(ended - started)
            if ok:
                try:
                    done.append((eid, index, encode_result(value)))
                    continue
                except Exception as e:  # noqa: BLE001 - a result that cannot be encoded
                    value = e
            out.observe(waits, durations)
            completed = report_failure(out, src, (eid, job, index, attempt, kind, raw),
                                       value) or completed
        if unstarted:
            src.hand_back([e for e in entries if e[0].decode() in unstarted])
        return done, completed

    async def _run_groups(self, tasks: list[list[tuple[str, str, int, str, int]]],
                          payloads: list[list[Any]], limits: list[float | None], share: int
                          ) -> list[list[_Outcome]]:
        """Every group's entries, ``share`` groups at a time: that many runner tasks take
        the groups in turn (a task per runner, not per group)."""
        out: list[list[_Outcome]] = [[] for _ in tasks]
        order = iter(range(len(tasks)))  # shared: each runner takes the next group

        async def runner() -> None:
            for k in order:
                out[k] = await self._run_group(tasks[k], payloads[k], limits[k])

        n = min(max(1, share), len(tasks))
        if n == 1:
            await runner()
        elif n > 1:
            await asyncio.gather(*(runner() for _ in range(n)))
        return out

    async def _run_group(self, tasks: list[tuple[str, str, int, str, int]],
                         payloads: list[Any], limit: float | None) -> list[_Outcome]:
        """One group's entries in order, each with its own current task, each cancelled
        at its job's timeout ``limit``."""
        w, clock, me = self.w, time.perf_counter, threading.get_ident()
        outcomes: list[_Outcome] = []
        for task, payload in zip(tasks, payloads):
            # this thread noted as starting the job from its check of the cancels to the
            # handler's call (:mod:`streamq.base.cancels`; nothing awaits between)
            if cancels.begin(task[1], me) or w.stopping.is_set():
                cancels.started(me)
                outcomes.append(None)
                continue
            hooks.at("in_handler")
            started = clock()
            _current.set(task if limit is None else (*task, time.time() + limit))
            cancels.started(me)
            try:
                value = await guarded(w.handler(payload), limit,
                                      None if limit is None else started + limit)
                outcomes.append((True, value, started, clock()))
            except Exception as e:  # noqa: BLE001 - reported as a failed attempt
                outcomes.append((False, e, started, clock()))
        return outcomes

    def call(self, task: tuple[Any, ...], payload: Any, limit: float | None = None,
             started: float | None = None) -> Any:
        """Run the handler for one entry on the worker's event loop; wait for its result.
        With a ``limit`` the handler is cancelled ``limit`` after ``started``
        (time.perf_counter; default now: the deadline its task tells it) with
        HandlerTimeout; one that ignores its cancellation is given up a little later."""
        assert self.w.loop is not None
        deadline = None if limit is None else (
            time.perf_counter() if started is None else started) + limit
        fut = asyncio.run_coroutine_threadsafe(self._acall(task, payload, limit, deadline),
                                               self.w.loop)
        if limit is None:
            return fut.result()
        # (not fut.result(timeout): a TimeoutError of the handler's own would look the same)
        if not concurrent.futures.wait([fut], limit + CANCEL_GRACE_S + 0.5).done:
            fut.cancel()
            raise HandlerTimeout(limit)
        return fut.result()

    async def _acall(self, task: tuple[Any, ...], payload: Any, limit: float | None,
                     deadline: float | None) -> Any:
        _current.set(task)
        return await guarded(self.w.handler(payload), limit, deadline)
