"""The Queues view's charts: rates and queue wait over the last hour, from the
queue's stats stream (:mod:`streamq.history`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .. import history
from ..connection import Client
from ..keys import QueueKeys
from .charts import Chart, Series, chart

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


def trends(r: Client, shards: Sequence[QueueKeys]) -> Trends:
    """The last hour of the queue, a point a minute."""
    h = history.read_history(r, list(shards), window_ms=WINDOW_MS, bucket_ms=BUCKET_MS)
    rows = h.rows
    rates = chart("sub-requests per second", "/s", [
        Series("started", [b.started_per_s for b in rows]),
        Series("finished", [b.finished_per_s for b in rows]),
        Series("failed", [b.failed_per_s for b in rows]),
    ])
    wait = chart("queue wait", "ms", [
        Series("p50", [b.wait_p50_ms for b in rows]),
        Series("p95", [b.wait_p95_ms for b in rows]),
        Series("p99", [b.wait_p99_ms for b in rows]),
    ])
    last = rows[-1] if rows else None
    return Trends(rates, wait,
                  last.started_per_s if last else 0.0,
                  last.finished_per_s if last else 0.0,
                  last.failed_per_s if last else 0.0,
                  last.wait_p50_ms if last else None,
                  last.wait_p95_ms if last else None,
                  last.wait_p99_ms if last else None)
