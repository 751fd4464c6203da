"""Running the entries of an ``async def`` handler on the worker's event loop thread:
several claimed tokens' entries at once (one coroutine per token, so a job never has
more running than its tokens), or one call for a slot that runs one entry at a time.
Each run is bounded by its job's timeout, a handler that ignores its cancellation
included (:func:`streamq.watchdog.guarded`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from streamq.base import cancels, hooks
from streamq.base.codec import encode_result
from streamq.base.entry_fields import _checked, _parse
from streamq.base.keys import JobKeys, QueueKeys
from streamq.base.running import current as _current
from streamq.errors import HandlerTimeout, PayloadError
from streamq.services.watchdog import CANCEL_GRACE_S, guarded
from streamq.work.outcomes import Outcomes, OutcomeWorker

if TYPE_CHECKING:
    from streamq.services.watchdog import Timeouts

#: an entry ready to run: entry id, index, type, raw payload, attempt, decoded payload
_Item = tuple[str, int, bytes, bytes, int, Any]
#: how an async run of one entry ended: (ok, value or exception, started, ended), or
#: None when it was not started (the worker is stopping)
_Outcome = tuple[bool, Any, float, float] | None
#: what one claimed token's run gives back: results not yet acknowledged, and whether
#: its job completed
Ran = tuple[list[tuple[str, int, bytes]], bool]


class AsyncWorker(OutcomeWorker, Protocol):
    """What running an ``async def`` handler reads of the worker."""

    @property
    def handler(self) -> Callable[[Any], Any]: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...
    @property
    def timeouts(self) -> Timeouts: ...
    @property
    def outcomes(self) -> Outcomes: ...


class AsyncEntries:
    """Runs entries through the worker's ``async def`` handler."""

    def __init__(self, worker: AsyncWorker) -> None:
        self.w = worker

    def run(
        self, jobs: list[tuple[JobKeys, list[Any], list[str], set[str]]],
        waits: list[float], durations: list[float], shard: QueueKeys,
    ) -> list[Ran]:
        """Run the entries of several claimed tokens: each token's entries in order,
        every token's at once on the worker's event loop. ``jobs`` holds, per token, its
        job and what :meth:`streamq.entries.EntryRunner.run_entries` takes; no entry may
        be suspect (those run alone, through it).

        Returns, per token, the results not yet acknowledged and whether the job
        completed (a failure can complete it)."""
        w = self.w
        assert w.loop is not None
        out: list[Ran] = []
        items: list[list[_Item]] = []
        for jk, entries, ids, unacked in jobs:
            if w.tracer is not None:
                w.tracer.note([(jk.job_id, i) for i in ids], [e[1] for e in entries])
            ready, completed = self._ready(jk, entries, ids, unacked, shard)
            items.append(ready)
            out.append(([], completed))
        tasks = [[(w.q.name, jk.job_id, it[1], it[0], it[4]) for it in ready]
                 for (jk, _, _, _), ready in zip(jobs, items)]
        limits = [w.timeouts.of(jk.job_id, w.redis) for jk, _, _, _ in jobs]
        ran = asyncio.run_coroutine_threadsafe(
            self._run_tokens(tasks, [[it[5] for it in ready] for ready in items], limits),
            w.loop).result()
        for k, ((jk, _, _, unacked), ready, outcomes) in enumerate(zip(jobs, items, ran)):
            out[k] = self._settle(jk, unacked, ready, outcomes, out[k], waits, durations,
                                  shard)
        return out

    def _ready(self, jk: JobKeys, entries: list[Any], ids: list[str], unacked: set[str],
               shard: QueueKeys) -> tuple[list[_Item], bool]:
        """A token's entries parsed for running; a malformed one is dead-lettered (True
        when that completed the job)."""
        ready: list[_Item] = []
        completed = False
        for n, (_, flat) in enumerate(entries):
            index, kind, raw, attempt, _suspect = _parse(flat)
            try:
                index, kind, raw, payload = _checked(index, kind, raw)
                ready.append((ids[n], index, kind, raw, attempt, payload))
            except PayloadError as e:
                completed = self.w.outcomes.malformed(jk.job_id, ids[n], index, kind, raw,
                                                      e, unacked, shard) or completed
        return ready, completed

    def _settle(self, jk: JobKeys, unacked: set[str], ready: list[_Item],
                outcomes: list[_Outcome], before: Ran, waits: list[float],
                durations: list[float], shard: QueueKeys) -> Ran:
        """What a token's runs gave: results to acknowledge, failures reported, the
        entries never started handed back."""
        out = self.w.outcomes
        done, completed = before
        to_wall = time.time() - time.perf_counter()
        unstarted = [it[0].encode() for it, o in zip(ready, outcomes) if o is None]
        for (eid, index, kind, raw, attempt, _), outcome in zip(ready, outcomes):
            if outcome is None:
                continue
            ok, value, started, ended = outcome
            wait = started + to_wall - int(eid[:eid.find("-")]) / 1000
            waits.append(wait if wait > 0.0 else 0.0)
            durations.append(ended - started)
            if ok:
                try:
                    done.append((eid, index, encode_result(value)))
                    continue
                except Exception as e:  # noqa: BLE001 - a result that cannot be encoded
                    value = e
            out.observe(waits, durations)
            completed = out.failed(jk.job_id, eid, index, attempt, value, kind, raw,
                                   shard) or completed
            self.w.leases.discard(unacked, (eid,))
        if unstarted:
            out.requeue(jk.job_id, unstarted)
        return done, completed

    async def _run_tokens(self, tasks: list[list[tuple[str, str, int, str, int]]],
                          payloads: list[list[Any]], limits: list[float | None]
                          ) -> list[list[_Outcome]]:
        return list(await asyncio.gather(*(self._run_token(t, p, limit)
                                           for t, p, limit in zip(tasks, payloads, limits))))

    async def _run_token(self, tasks: list[tuple[str, str, int, str, int]],
                         payloads: list[Any], limit: float | None) -> list[_Outcome]:
        """One token's entries in order (a task of its own: its own current task), each
        cancelled at its job's timeout ``limit``."""
        w, clock = self.w, time.perf_counter
        outcomes: list[_Outcome] = []
        for task, payload in zip(tasks, payloads):
            if w.stopping.is_set() or cancels.seen(task[1]):
                outcomes.append(None)
                continue
            hooks.at("in_handler")
            started = clock()
            _current.set(task if limit is None else (*task, time.time() + limit))
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
