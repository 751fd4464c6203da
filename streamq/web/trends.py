"""The Queues view's charts: rates and queue wait over the last hour, from the
queue's stats stream (:mod:`streamq.history`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streamq.base.keys import QueueKeys
from streamq.services import history
from streamq.storage.connection import Client

from .charts import Chart, Series, chart

#: Seconds a queue's charts are served before its history is read again (its stats
#: stream gets an entry per worker heartbeat: reading an hour of it is not free).
REFRESH_S = 5.0
#: The charts' window and bucket, ms.
WINDOW_MS = 3_600_000
BUCKET_MS = 60_000


@dataclass(frozen=True)
class Trends:
    rates: Chart
    wait: Chart
    started_per_s: float  #: over the last bucket
    finished_per_s: float
    failed_per_s: float
    wait_p50_ms: float | None
    wait_p95_ms: float | None
    wait_p99_ms: float | None


def wait_chart(waits_ms: dict[str, list[float | None]]) -> Chart:
    """The queue-wait chart, in ms, or in seconds once a wait reaches 2 s (as the
    page's other durations turn to seconds)."""
    measured = [v for vs in waits_ms.values() for v in vs if v is not None]
    scale, unit = (1000.0, "s") if measured and max(measured) >= 2000 else (1.0, "ms")
    return chart("queue wait", unit, [
        Series(name, [None if v is None else v / scale for v in vs])
        for name, vs in waits_ms.items()])


def trends(r: Client, shards: Sequence[QueueKeys]) -> Trends:
    """The last hour of the queue, a point a minute."""
    h = history.read_history(r, list(shards), window_ms=WINDOW_MS, bucket_ms=BUCKET_MS)
    rows = h.rows
    rates = chart("sub-requests per second", "/s", [
        Series("started", [b.started_per_s for b in rows]),
        Series("finished", [b.finished_per_s for b in rows]),
        Series("failed", [b.failed_per_s for b in rows]),
    ])
    wait = wait_chart({"p50": [b.wait_p50_ms for b in rows],
                       "p95": [b.wait_p95_ms for b in rows],
                       "p99": [b.wait_p99_ms for b in rows]})
    last = rows[-1] if rows else None
    return Trends(rates, wait,
                  last.started_per_s if last else 0.0,
                  last.finished_per_s if last else 0.0,
                  last.failed_per_s if last else 0.0,
                  last.wait_p50_ms if last else None,
                  last.wait_p95_ms if last else None,
                  last.wait_p99_ms if last else None)


class TrendCache:
    """Each queue's latest charts, read again once older than :data:`REFRESH_S`."""

    def __init__(self, client: Callable[[], Client]) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[float, Trends]] = {}

    def get(self, shards: Sequence[QueueKeys]) -> Trends:
        name = shards[0].name
        with self._lock:
            have = self._latest.get(name)
        if have is not None and time.monotonic() - have[0] < REFRESH_S:
            return have[1]
        got = trends(self._client(), shards)
        with self._lock:
            self._latest[name] = (time.monotonic(), got)
        return got
