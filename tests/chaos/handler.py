"""The handlers the chaos workers run; they record every run in a file of their process.

Payload: ``{"u": uid, "n": int, "m": mode, "k": failures, "s": sleep seconds}``;
mode ``ok`` returns :func:`expected`, ``flaky`` raises on its first ``k``
attempts, ``poison`` always raises, ``hang`` runs ``s`` seconds past its job's
timeout on its first ``k`` attempts (an ``async def`` handler swallows the
cancellation at the deadline and goes on) and then returns :func:`late`, a value
that must never be stored; later attempts return :func:`expected`. A payload
with ``"w": 1`` is watched: its runs are also written to ``$CHAOS_DIR/watch-<job>``
so a producer can time a cancel to them.

:func:`run` is the sync handler, :func:`run_async` the ``async def`` one. Each
run appends lines to ``$CHAOS_DIR/runs-<proc>.log`` (``O_APPEND``, one ``write``
per line, so a SIGKILL never leaves half a line; ``<proc>`` is ``<pid>-<nonce>``)::

    S job index attempt run t_ns deadline_ns    at the start
    E job index run t_ns                         returned (``L``: returned late)
    F job index run t_ns                         raised

``run`` is ``<proc>.<n>``, unique per run; ``t_ns`` is ``CLOCK_MONOTONIC`` (one clock
for every process of the machine, which tests.chaos.skew leaves alone);
``deadline_ns`` is when the worker gives the run up (its job's timeout, on the same
clock) or ``-``. A start without an end is a run cut short by a process death.

Importing this module in a worker (``--handler``) also records the worker's
heartbeats: every beat that went through appends ``B t0_ns t1_ns`` (sent, returned)
to ``$CHAOS_DIR/beats-<proc>.log``, which the concurrency check reads to tell a
stalled process (presumed dead: its tokens may run elsewhere) from a live one; and,
with ``CHAOS_SABOTAGE=timeout``, breaks the worker on purpose (:func:`_keep_late_values`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import Any

from streamq import current_task

_fds: dict[str, int] = {}
_serial = itertools.count(1)
#: this process's name in the records: its pid (a pid may be reused) and a nonce
_PROC = f"{os.getpid()}-{os.urandom(3).hex()}"


def now_ns() -> int:
    """The records' clock: CLOCK_MONOTONIC, the same in every process of the machine."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def expected(payload: dict[str, Any]) -> dict[str, Any]:
    """The result a successful run returns for ``payload``."""
    n = int(payload["n"])
    return {"u": payload["u"], "v": n * n + 7}


def late(payload: dict[str, Any]) -> dict[str, Any]:
    """What a ``hang`` run returns past its deadline: never to be stored."""
    return {"u": payload["u"], "late": True}


def _write(name: str, line: str) -> None:
    fd = _fds.get(name)
    if fd is None:
        path = os.path.join(os.environ["CHAOS_DIR"], name)
        fd = _fds[name] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())


class _Run:
    """One handler run's records."""

    def __init__(self, payload: Any) -> None:
        task = current_task()
        assert task is not None
        self.task, self.payload = task, payload
        self.id = f"{_PROC}.{next(_serial)}"
        self.where = f"{task.job_id} {task.index}"
        self.watch = f"watch-{task.job_id}" if payload.get("w") else ""
        deadline = "-"
        if task.deadline is not None:  # the worker's wall clock, maybe skewed: as a span
            deadline = str(now_ns() + int((task.deadline - time.time()) * 1e9))
        self.log(f"S {self.where} {task.attempt} {self.id} {now_ns()} {deadline}\n")

    def log(self, line: str) -> None:
        _write(f"runs-{_PROC}.log", line)
        if self.watch:
            _write(self.watch, line)

    @property
    def mode(self) -> str:
        return str(self.payload.get("m", "ok"))

    @property
    def hangs(self) -> bool:
        return self.mode == "hang" and self.task.attempt <= int(self.payload.get("k", 1))

    def overrun_s(self) -> float:
        """How long a hanging run sleeps: past its deadline by ``s`` seconds."""
        d = self.task.deadline
        return (0.0 if d is None else max(0.0, d - time.time())) + float(self.payload["s"])

    def outcome(self) -> Any:
        """Raise for a failing mode; else the value to return (after the sleep)."""
        p, task = self.payload, self.task
        if self.mode == "poison" or (self.mode == "flaky" and task.attempt <= int(p.get("k", 1))):
            self.log(f"F {self.where} {self.id} {now_ns()}\n")
            raise RuntimeError(f"chaos: {self.mode} payload {p['u']} (attempt {task.attempt})")
        if self.hangs:
            self.log(f"L {self.where} {self.id} {now_ns()}\n")
            return late(p)
        self.log(f"E {self.where} {self.id} {now_ns()}\n")
        return expected(p)


def run(payload: Any) -> Any:
    r = _Run(payload)
    sleep = r.overrun_s() if r.hangs else float(payload.get("s", 0))
    if sleep:
        time.sleep(sleep)
    return r.outcome()


async def run_async(payload: Any) -> Any:
    r = _Run(payload)
    sleep = r.overrun_s() if r.hangs else float(payload.get("s", 0))
    if sleep:
        end = time.monotonic() + sleep
        while (left := end - time.monotonic()) > 0:
            try:
                await asyncio.sleep(left)
            except asyncio.CancelledError:
                if not r.hangs:
                    r.log(f"F {r.where} {r.id} {now_ns()}\n")
                    raise
                # a hanging run ignores its cancellation and goes on past its timeout
    return r.outcome()


def _record_beats() -> None:
    """Wrap the worker's heartbeat so each one that went through is recorded."""
    from streamq.work.leases import LeaseKeeper

    beat = LeaseKeeper.heartbeat
    if getattr(beat, "chaos_recorded", False):
        return

    def heartbeat(self: LeaseKeeper) -> None:
        t0 = now_ns()
        beat(self)
        _write(f"beats-{_PROC}.log", f"B {t0} {now_ns()}\n")

    heartbeat.chaos_recorded = True  # type: ignore[attr-defined]
    LeaseKeeper.heartbeat = heartbeat  # type: ignore[method-assign]


def _keep_late_values() -> None:
    """Break the worker on purpose (``python -m tests.chaos --sabotage timeout``), to
    show that the check fires: no timeout at all, what a run returns late is kept."""
    from streamq.services import watchdog
    from streamq.work import entries

    async def unguarded(coro: Any, limit_s: float | None, deadline: float | None = None
                        ) -> Any:
        return await coro

    entries.guarded = unguarded  # type: ignore[attr-defined]
    watchdog.Watchdog.call = (  # type: ignore[method-assign]
        lambda self, fn, arg, limit_s, deadline=None: fn(arg))


if "CHAOS_DIR" in os.environ:
    _record_beats()
    if os.environ.get("CHAOS_SABOTAGE") == "timeout":
        _keep_late_values()
