"""Scheduled jobs: ``submit(..., delay=S)`` or ``submit(..., at=datetime)``.

A scheduled job is stored at once (its meta, stream and group); its
sub-requests wait in the job's retry ZSET as first attempts due at its time,
and its tokens are registered parked, with the job's due time in the shard's
``retries``. Live workers take due jobs there in their settle (as they take
jobs whose retries are due), promote the sub-requests into the stream and
unpark the tokens: no reaper is needed, and the reaper's own pass promotes
them should no worker run. Times are Redis's clock: ``delay`` is counted from
the create script's TIME, ``at`` is compared with it.
"""

from __future__ import annotations

import math
from datetime import datetime

from streamq.errors import ConfigError
from streamq.storage.connection import Client, server_ms

__all__ = ["check_future", "not_yet_due", "when"]

#: The longest a job may be scheduled ahead (a year): a typo's guard, not a limit of
#: the mechanism.
MAX_DELAY_S = 366 * 24 * 3600


def when(delay: float | None, at: datetime | None) -> str:
    """The create script's ``when`` argument: "" (ready now), "+<ms>" or "@<epoch ms>".
    Raises ConfigError for both given, a negative or non-finite delay, a naive ``at``."""
    if delay is not None and at is not None:
        raise ConfigError("give delay or at, not both")
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not math.isfinite(
                delay) or delay < 0 or delay > MAX_DELAY_S:
            raise ConfigError(f"delay must be a number of seconds from 0 to {MAX_DELAY_S}, "
                              f"got {delay!r}")
        ms = round(delay * 1000)
        return f"+{ms}" if ms > 0 else ""
    if at is not None:
        if not isinstance(at, datetime):
            raise ConfigError(f"at must be a datetime, got {type(at).__name__}")
        if at.tzinfo is None or at.utcoffset() is None:
            raise ConfigError("at must be timezone-aware (e.g. datetime.now(timezone.utc)): "
                              "a naive datetime names no instant")
        return f"@{round(at.timestamp() * 1000)}"
    return ""


def check_future(client: Client, at: datetime | None, key: str) -> None:
    """Refuse (ConfigError) an ``at`` already past, or more than a year ahead, by
    Redis's clock (the master holding ``key`` on a cluster): nothing is reserved or
    written before this check. The create script checks again, atomically."""
    if at is None:
        return
    now = server_ms(client, key)
    due = round(at.timestamp() * 1000)
    if due < now:
        raise ConfigError(f"at {at.isoformat()} is {(now - due) / 1000:.3f} s in the past by "
                          "Redis's clock: nothing was submitted")
    if due - now > MAX_DELAY_S * 1000:
        raise ConfigError(f"at {at.isoformat()} is more than {MAX_DELAY_S // 86400} days "
                          "ahead")


def not_yet_due(state: str, due: object, stream: int, done: int, failed: int,
                retries: int) -> bool:
    """A scheduled job none of whose sub-requests has come due yet: it has a ``due``
    time, is live (meta ``state`` open or active), has no entry in its stream (none
    delivered or waiting there), none settled, and some waiting in its retry set.
    What status and the queue overview show as ``scheduled``."""
    return (bool(due) and state in ("open", "active") and stream == 0 and done == 0
            and failed == 0 and retries > 0)
