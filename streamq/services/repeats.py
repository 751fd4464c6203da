"""Repeating jobs: what a schedule is, and when it ticks next (no server needed).

A repeat is a named schedule of a queue: a cron expression (five fields, in a time
zone) or an interval in seconds, and the job it submits at each tick (payloads and
the job's settings). It is stored in its queue's hash slot (:mod:`streamq.producer.
repeating`); whoever runs recovery passes submits its due ticks
(:mod:`streamq.reaping.ticker`). This module is the part with no Redis in it: the
spec, its checks and its JSON form, the job id of a tick, and the next tick after
a time.

A tick's job id is ``<queue>.<repeat>.<tick ms>``: the same for every process that
submits that tick, so a tick submitted twice makes one job. Missed ticks (no ticker
ran for a while) are not made up: a late tick runs once, and the next one is the
first due after the later of that tick and now.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from streamq.base import config
from streamq.base.keys import check_client, check_name
from streamq.errors import ConfigError

__all__ = ["MAX_SPEC_BYTES", "RepeatSpec", "next_tick", "tick_job_id"]

#: the largest stored spec (its payloads included), in bytes of JSON
MAX_SPEC_BYTES = 64 * 1024
#: the shortest interval, in seconds (ticks are taken about once a second)
MIN_EVERY_S = 1.0
#: the longest interval, in seconds (a year, as a scheduled job's longest delay)
MAX_EVERY_S = 366 * 24 * 3600.0
#: a tick's job id is the queue's name, the repeat's, and 13 digits: within 128
_ID_ROOM = 128 - 15


@dataclass(frozen=True)
class RepeatSpec:
    """One repeat: its schedule (``cron`` in ``tz``, or ``every`` seconds from
    ``start_ms``), and the job each tick submits."""

    name: str
    payloads: list[Any]
    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"
    start_ms: int = 0
    priority: int = config.DEFAULT_PRIORITY
    concurrency: int = config.DEFAULT_CONCURRENCY
    client: str = config.DEFAULT_CLIENT
    max_deliveries: int = config.DEFAULT_MAX_DELIVERIES
    timeout: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def check(self, queue: str) -> RepeatSpec:
        """Return self if every part is valid for ``queue``, else raise ConfigError."""
        check_name("repeat name", self.name)
        if len(queue) + len(self.name) > _ID_ROOM:
            raise ConfigError(f"repeat name {self.name!r} is too long for queue {queue!r}: "
                              f"their names may have {_ID_ROOM} characters together")
        if (self.cron is None) == (self.every is None):
            raise ConfigError("give a repeat a cron expression or an interval (every), "
                              "one of the two")
        zone(self.tz)
        if self.cron is not None:
            _trigger(self.cron, self.tz)
        elif (isinstance(self.every, bool) or not isinstance(self.every, (int, float))
              or not math.isfinite(self.every)
              or not MIN_EVERY_S <= self.every <= MAX_EVERY_S):
            raise ConfigError(f"every must be a number of seconds from {MIN_EVERY_S:g} to "
                              f"{MAX_EVERY_S:g}, got {self.every!r}")
        if not isinstance(self.payloads, list) or not 1 <= len(self.payloads) <= config.ADD_CHUNK:
            raise ConfigError(f"a repeat's job has 1 to {config.ADD_CHUNK} payloads (a list "
                              "of JSON values)")
        check_client(self.client)
        for what, value, hi in (("priority", self.priority, config.MAX_PRIORITY),
                                ("concurrency", self.concurrency, config.MAX_CONCURRENCY),
                                ("max_deliveries", self.max_deliveries, 1000)):
            low = 0 if what == "priority" else 1
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= hi:
                raise ConfigError(f"{what} must be an integer from {low} to {hi}, got {value!r}")
        return self

    def to_json(self) -> str:
        """The stored form; ConfigError when a payload is not JSON or the spec is too big."""
        body = {k: v for k, v in asdict(self).items() if k != "extra" and v is not None}
        try:
            text = json.dumps(body, separators=(",", ":"), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"a repeat's payloads must be JSON values: {e}") from None
        if len(text.encode()) > MAX_SPEC_BYTES:
            raise ConfigError(f"repeat {self.name!r} is {len(text.encode())} bytes of JSON; "
                              f"the most is {MAX_SPEC_BYTES}")
        return text

    @classmethod
    def from_json(cls, raw: str | bytes) -> RepeatSpec:
        """The spec stored as ``raw``; ConfigError when it is not one streamq wrote."""
        try:
            body = json.loads(raw)
            known = {k: body.pop(k) for k in list(body) if k in cls.__dataclass_fields__}
            return cls(**known, extra=body)
        except (ValueError, TypeError, AttributeError) as e:
            raise ConfigError(f"a stored repeat is not valid JSON of a repeat: {e}") from None

    @property
    def schedule(self) -> str:
        """The schedule as people write it: ``cron 0 3 * * * (Europe/Paris)`` or
        ``every 30 s``."""
        if self.cron is not None:
            return f"cron {self.cron} ({self.tz})"
        return f"every {self.every:g} s"


def zone(tz: str) -> ZoneInfo:
    """The time zone named ``tz`` (IANA, e.g. ``Europe/Paris``); ConfigError if unknown."""
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ConfigError(f"unknown time zone {tz!r}: use an IANA name such as UTC or "
                          "Europe/Paris") from None


def _trigger(cron: str, tz: str) -> Any:
    from apscheduler.triggers.cron import CronTrigger

    if not isinstance(cron, str) or len(cron.split()) != 5:
        raise ConfigError(f"a cron expression has five fields (minute hour day month "
                          f"weekday), got {cron!r}")
    try:
        return CronTrigger.from_crontab(cron, timezone=zone(tz))
    except ValueError as e:
        raise ConfigError(f"invalid cron expression {cron!r}: {e}") from None


def next_tick(spec: RepeatSpec, after_ms: int) -> int:
    """The first tick of ``spec`` strictly after ``after_ms`` (epoch ms)."""
    if spec.every is not None:
        step = round(spec.every * 1000)
        if after_ms < spec.start_ms:
            return spec.start_ms
        return spec.start_ms + ((after_ms - spec.start_ms) // step + 1) * step
    start = datetime.fromtimestamp((after_ms + 1) / 1000, UTC)
    fire: datetime | None = _trigger(spec.cron or "", spec.tz).get_next_fire_time(None, start)
    if fire is None:  # (a cron of 5 fields always fires again)
        raise ConfigError(f"cron {spec.cron!r} never fires again")
    return math.ceil(fire.timestamp() * 1000)


def tick_job_id(queue: str, name: str, tick_ms: int) -> str:
    """The job id of repeat ``name``'s tick at ``tick_ms``: the same in every process."""
    return f"{queue}.{name}.{tick_ms}"
