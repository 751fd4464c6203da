"""Repeating jobs of a queue (``Queue.repeats``, ``streamq repeat``): add, list,
pause, resume and remove schedules that submit a job at each tick.

    q.repeats.add("nightly", ["refresh"], cron="0 3 * * *", tz="Europe/Paris")
    q.repeats.add("poll", [{"url": "..."}], every=30)

A repeat lives in its queue's hash slot: its spec in ``repeats`` (JSON, see
:mod:`streamq.services.repeats`), its next tick in ``repeat-next`` (none while
paused) and the last tick submitted in ``repeat-last``. Every process that runs
recovery passes (a reaper, and a worker's own recovery) submits the due ticks
(:mod:`streamq.reaping.ticker`): once each however many run, as a tick's job id is
made of the tick. Every time is Redis's clock: a tick is computed from the server's
time, and the scripts check it against their own.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from streamq.base import config
from streamq.base.codec import encode
from streamq.base.replies import ScriptErrorCode
from streamq.errors import ConfigError
from streamq.services.repeats import RepeatSpec, next_tick, tick_job_id
from streamq.services.watchdog import timeout_ms
from streamq.storage.connection import server_ms

if TYPE_CHECKING:
    from streamq.model.queue_view import Served

__all__ = ["Repeat", "Repeats"]


@dataclass(frozen=True)
class Repeat:
    """A stored repeat as listed: its spec, its next tick (None while paused) and the
    last tick it submitted, in epoch ms."""

    spec: RepeatSpec
    next_ms: int | None
    last_ms: int | None
    queue: str

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def paused(self) -> bool:
        return self.next_ms is None

    @property
    def next_at(self) -> datetime | None:
        return _at(self.next_ms)

    @property
    def last_at(self) -> datetime | None:
        return _at(self.last_ms)

    @property
    def last_job(self) -> str | None:
        """The id of the job of the last tick submitted."""
        return None if self.last_ms is None else tick_job_id(self.queue, self.name,
                                                             self.last_ms)

    def as_dict(self) -> dict[str, Any]:
        s = self.spec
        return {"name": s.name, "schedule": s.schedule, "cron": s.cron, "every": s.every,
                "tz": s.tz, "paused": self.paused, "next_ms": self.next_ms,
                "next_at": _iso(self.next_at), "last_ms": self.last_ms,
                "last_at": _iso(self.last_at), "last_job": self.last_job,
                "payloads": s.payloads, "priority": s.priority,
                "concurrency": s.concurrency, "client": s.client,
                "max_deliveries": s.max_deliveries, "timeout": s.timeout}


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat(timespec="milliseconds")


def _at(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


class Repeats:
    """The repeats of one queue: ``Queue(...).repeats``."""

    def __init__(self, q: Served) -> None:
        self.q = q

    def add(self, name: str, payloads: list[Any], *, cron: str | None = None,
            every: float | None = None, tz: str = "UTC",
            priority: int = config.DEFAULT_PRIORITY,
            concurrency: int = config.DEFAULT_CONCURRENCY,
            client: str = config.DEFAULT_CLIENT,
            max_deliveries: int = config.DEFAULT_MAX_DELIVERIES,
            timeout: float | None = None) -> Repeat:
        """Add repeat ``name``, or replace it (it runs again if paused): at each tick of
        ``cron`` (five fields, in time zone ``tz``) or every ``every`` seconds from now,
        one job of ``payloads`` (JSON values) with these settings is submitted. Every
        part is checked first (ConfigError), nothing stored on a bad one."""
        timeout_ms(timeout)
        for p in payloads if isinstance(payloads, list) else ():
            encode(p)  # PayloadError now, not at a tick
        qk = self.q.keys
        now = server_ms(self.q.redis, qk.repeats)
        spec = RepeatSpec(name, payloads, cron=cron, every=every, tz=tz, start_ms=now,
                          priority=priority, concurrency=concurrency, client=client,
                          max_deliveries=max_deliveries, timeout=timeout).check(qk.name)
        first = next_tick(spec, now)
        self._run("repeat_set", (qk.repeats, qk.repeat_next, qk.repeat_last),
                  (spec.name, spec.to_json(), first), name)
        return Repeat(spec, first, self._last(name), qk.name)

    def get(self, name: str) -> Repeat:
        """Repeat ``name``; ConfigError when the queue has none of that name."""
        for r in self._read([name]):
            return r
        raise ConfigError(f"queue {self.q.keys.name!r} has no repeat {name!r}")

    def list(self) -> builtins.list[Repeat]:
        """Every repeat of the queue, by name."""
        raw: Any = self.q.redis.hgetall(self.q.keys.repeats)  # (HKEYS is no role's read)
        specs = {n.decode(): spec for n, spec in raw.items()}
        return self._read(sorted(specs), specs)

    def pause(self, name: str) -> bool:
        """Pause repeat ``name`` (no tick submits until :meth:`resume`); False when it
        was paused already. ConfigError when there is none of that name."""
        qk = self.q.keys
        return self._run("repeat_pause", (qk.repeats, qk.repeat_next),
                         (name, "pause", ""), name) == 1

    def resume(self, name: str) -> bool:
        """Resume repeat ``name`` from its next tick after now (ticks missed while paused
        are not made up); False when it was running."""
        spec, qk = self.get(name).spec, self.q.keys
        tick = next_tick(spec, server_ms(self.q.redis, qk.repeats))
        return self._run("repeat_pause", (qk.repeats, qk.repeat_next),
                         (name, "resume", tick), name) == 1

    def remove(self, name: str) -> bool:
        """Remove repeat ``name`` (the jobs its ticks submitted stay); False when there
        was none."""
        qk = self.q.keys
        return self._run("repeat_remove", (qk.repeats, qk.repeat_next, qk.repeat_last),
                         (name,), name) == 1

    def _run(self, script: str, keys: tuple[str, ...], args: tuple[Any, ...], name: str) -> int:
        reply = int(self.q.scripts.run(script, keys, args))
        if reply == ScriptErrorCode.NO_REPEAT:
            raise ConfigError(f"queue {self.q.keys.name!r} has no repeat {name!r}")
        if reply == ScriptErrorCode.TICK_PAST:
            raise ConfigError(f"repeat {name!r}: its next tick is not within a year of "
                              "Redis's clock")
        return reply

    def _last(self, name: str) -> int | None:
        last: Any = self.q.redis.zscore(self.q.keys.repeat_last, name)
        return None if last is None else int(last)

    def _read(self, names: builtins.list[str],
              read: dict[str, Any] | None = None) -> builtins.list[Repeat]:
        """The repeats ``names`` (their specs read here, or given as ``read``)."""
        if not names:
            return []
        qk, pipe = self.q.keys, self.q.redis.pipeline(transaction=False)
        if read is None:
            pipe.hmget(qk.repeats, names)
        for n in names:
            pipe.zscore(qk.repeat_next, n)
            pipe.zscore(qk.repeat_last, n)
        replies = pipe.execute()
        specs, scores = ((replies[0], replies[1:]) if read is None
                         else ([read[n] for n in names], replies))
        out: builtins.list[Repeat] = []
        for i, (n, raw) in enumerate(zip(names, specs)):
            if raw is None:
                continue
            nxt, last = scores[2 * i], scores[2 * i + 1]
            spec = replace(RepeatSpec.from_json(raw), name=n)
            out.append(Repeat(spec, None if nxt is None else int(nxt),
                              None if last is None else int(last), qk.name))
        return out
