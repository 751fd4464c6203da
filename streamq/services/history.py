"""A queue's recent activity: what its workers started, finished and failed, and how
long sub-requests waited in the queue, over the last hour.

Writers: each worker counts, per process, the sub-request attempts its slots start
(with their queue wait: from the entry's enqueueing to the handler's start, what
the ``streamq_queue_wait_seconds`` histogram observes), the results acknowledged
and the handler failures (retried or dead-lettered), in both lanes
(:class:`ActivityCounter`). Its heartbeat on the queue's first shard adds what
happened since its last counted beat to the stream ``sq:{<queue>}:stats`` (one
entry per beat that had something to report; trimmed by ``MINID`` to
``config.STATS_WINDOW_MS``). A batch is sent again, unchanged, until a beat
carrying it succeeds, and the script takes each batch once (its sequence number),
so counts are neither lost to a failed beat nor doubled by a retried one.

Reader: :func:`read_history` sums those entries into time buckets with plain
stream range reads, which the read-only ``inspector`` role may run.
"""

from __future__ import annotations

import math
import threading
import uuid
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from streamq.base.keys import QueueKeys
from streamq.errors import ConfigError
from streamq.storage.connection import Client, server_ms

__all__ = ["BOUNDS_MS", "ActivityCounter", "History", "HistoryRow", "HistoryTotals",
           "read_history"]

#: Upper bounds of the queue-wait histogram buckets, in milliseconds (a last bucket,
#: ``winf``, takes longer waits). About 1.5x apart from 1 ms to an hour, so a
#: percentile interpolated inside a bucket is off by less than a third of its value.
BOUNDS_MS: tuple[int, ...] = (
    1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 700,
    1_000, 1_500, 2_000, 3_000, 5_000, 7_000, 10_000, 15_000, 20_000, 30_000, 45_000,
    60_000, 90_000, 120_000, 180_000, 300_000, 600_000, 1_200_000, 1_800_000, 3_600_000)
#: The same bounds in seconds (what the slots measure).
_BOUNDS_S = [b / 1000 for b in BOUNDS_MS]
#: Field names of a stats entry: the counts, then one per histogram bucket.
_COUNTS = ("started", "finished", "failed")
_BUCKET_FIELDS = (*(f"w{b}" for b in BOUNDS_MS), "winf")
_FIELDS = (*_COUNTS, *_BUCKET_FIELDS)
_STARTED, _FINISHED, _FAILED, _FIRST_BUCKET = 0, 1, 2, 3

#: Stats entries read per round trip, and at most per :func:`read_history` call (the
#: newest first: past the cap, the oldest part of the window is left out).
PAGE = 1_000
MAX_ENTRIES = 50_000
#: The most buckets a history may have.
MAX_ROWS = 10_000
#: The percentiles reported.
PERCENTILES = (0.50, 0.95, 0.99)


class ActivityCounter:
    """A worker's counts since it started, for its heartbeat's stats batches.

    Each thread that counts (a slot) gets cells of its own, written by it alone, so
    counting takes no lock; the heartbeat sums every thread's cells and sends the
    difference from what its last successful batch covered. A batch, once made, is
    sent unchanged (same sequence number) until a beat carrying it succeeds.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._cells: list[list[int]] = []
        self._register = threading.Lock()  # taken once per counting thread
        #: the cumulative counts the last successful batch covered
        self._sent = [0] * len(_FIELDS)
        #: (batch id, cumulative counts it covers, its field/value pairs) not yet taken
        self._pending: tuple[str, list[int], list[tuple[str, int]]] | None = None
        self._nonce = uuid.uuid4().hex[:12]
        self._seq = 0

    def _mine(self) -> list[int]:
        cells: list[int] | None = getattr(self._local, "cells", None)
        if cells is None:
            cells = [0] * len(_FIELDS)
            with self._register:
                self._cells.append(cells)
            self._local.cells = cells
        return cells

    # -- the slots' side ----------------------------------------------------------

    def started(self, waits: Sequence[float]) -> None:
        """Attempts started, one per queue wait in ``waits`` (seconds)."""
        if not waits:
            return
        cells, bounds, first = self._mine(), _BOUNDS_S, _FIRST_BUCKET
        cells[_STARTED] += len(waits)
        for wait in waits:
            cells[first + bisect_left(bounds, wait)] += 1

    def finished(self, n: int) -> None:
        """Results acknowledged."""
        if n:
            self._mine()[_FINISHED] += n

    def failed(self, n: int = 1) -> None:
        """Handler failures (each attempt; retried or dead-lettered)."""
        self._mine()[_FAILED] += n

    # -- the heartbeat's side -------------------------------------------------------

    def _totals(self) -> list[int]:
        with self._register:
            cells = list(self._cells)
        return [sum(column) for column in zip(*cells)] if cells else [0] * len(_FIELDS)

    def batch(self) -> tuple[str, list[tuple[str, int]]] | None:
        """The batch the next beat carries: its id (``<process nonce>:<sequence>``) and
        its non-zero field/value pairs; None when nothing happened since the last one
        taken. The same batch until :meth:`sent`."""
        if self._pending is None:
            totals = self._totals()
            pairs = [(name, t - s) for name, t, s in zip(_FIELDS, totals, self._sent)
                     if t != s]
            if not pairs:
                return None
            self._seq += 1
            self._pending = (f"{self._nonce}:{self._seq}", totals, pairs)
        return self._pending[0], self._pending[2]

    def sent(self) -> None:
        """The beat carrying the pending batch succeeded."""
        if self._pending is not None:
            self._sent = self._pending[1]
            self._pending = None

    def unsent(self) -> bool:
        """True when counts wait for a beat."""
        return self._pending is not None or self._totals() != self._sent


# -- reading ---------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryRow:
    """One time bucket of a queue's history."""

    start_ms: int  #: the bucket's start, ms since the epoch (Redis's clock)
    started: int  #: attempts started in the bucket
    finished: int  #: results acknowledged in the bucket
    failed: int  #: handler failures (retried or dead-lettered) in the bucket
    started_per_s: float
    finished_per_s: float
    failed_per_s: float
    wait_p50_ms: float | None  #: queue wait percentiles, ms; None without a start
    wait_p95_ms: float | None
    wait_p99_ms: float | None


@dataclass(frozen=True)
class HistoryTotals:
    """The whole window of a queue's history."""

    started: int
    finished: int
    failed: int
    started_per_s: float
    finished_per_s: float
    failed_per_s: float
    wait_p50_ms: float | None
    wait_p95_ms: float | None
    wait_p99_ms: float | None


@dataclass(frozen=True)
class History:
    """A queue's activity over a window ending now, by Redis's clock, in ``bucket_ms``
    buckets (oldest first; the last one ends at ``at_ms``). Counts are those the
    workers' heartbeats reported, each at the time of the beat that carried it."""

    queue: str
    at_ms: int  #: Redis's clock when read, ms since the epoch
    window_ms: int  #: the span the rows cover (``window_ms`` rounded up to whole buckets)
    bucket_ms: int
    rows: list[HistoryRow]
    totals: HistoryTotals
    entries: int  #: stats entries read
    truncated: bool  #: more than MAX_ENTRIES in the window: the oldest were left out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(buckets: Sequence[tuple[float, int]], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a histogram of (upper bound, count) sorted by bound,
    interpolated linearly inside its bucket (from the bound before, or 0); a quantile in
    the unbounded last bucket is that bucket's lower bound. None when it is empty."""
    total = sum(n for _, n in buckets)
    if total == 0:
        return None
    rank = q * total
    below, lower = 0, 0.0
    for bound, n in buckets:
        if n and below + n >= rank:
            if math.isinf(bound):
                return lower
            return round(lower + (bound - lower) * max(rank - below, 0.0) / n, 3)
        below += n
        lower = bound
    return lower


def _bound(name: str) -> float | None:
    """The upper bound (ms) a ``w<bound>`` field names; None for another field."""
    if not name.startswith("w") or name == "worker":
        return None
    if name == "winf":
        return math.inf
    try:
        return float(name[1:])
    except ValueError:
        return None


class _Acc:
    """Sums of one bucket or of the window."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(_COUNTS, 0)
        self.waits: dict[float, int] = {}

    def add(self, fields: dict[Any, Any]) -> None:
        for raw, value in fields.items():
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            try:
                n = int(value)
            except ValueError:
                continue
            if name in self.counts:
                self.counts[name] += n
            else:
                bound = _bound(name)
                if bound is not None:
                    self.waits[bound] = self.waits.get(bound, 0) + n

    def merge(self, other: _Acc) -> None:
        for k, v in other.counts.items():
            self.counts[k] += v
        for b, n in other.waits.items():
            self.waits[b] = self.waits.get(b, 0) + n

    def rates(self, span_ms: int) -> dict[str, Any]:
        per_s = 1000 / span_ms
        hist = sorted(self.waits.items())
        p50, p95, p99 = (percentile(hist, q) for q in PERCENTILES)
        c = self.counts
        return {"started": c["started"], "finished": c["finished"], "failed": c["failed"],
                "started_per_s": c["started"] * per_s, "finished_per_s": c["finished"] * per_s,
                "failed_per_s": c["failed"] * per_s,
                "wait_p50_ms": p50, "wait_p95_ms": p95, "wait_p99_ms": p99}


def _entry_ms(entry_id: Any) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return int(text.partition("-")[0])


def _read_newest(r: Client, key: str, since_ms: int, cap: int
                 ) -> tuple[list[tuple[Any, dict[Any, Any]]], bool]:
    """The entries of stream ``key`` from ``since_ms`` on, newest first, at most ``cap``
    of them (pages of PAGE); and whether the cap left some out."""
    out: list[tuple[Any, dict[Any, Any]]] = []
    top: Any = "+"
    while len(out) < cap:
        count = min(PAGE, cap - len(out))
        page: Any = r.xrevrange(key, top, since_ms, count=count)
        out.extend(page)
        if len(page) < count:
            return out, False
        last = page[-1][0]
        top = "(" + (last.decode() if isinstance(last, bytes) else str(last))
    more = r.xrevrange(key, top, since_ms, count=1)
    return out, bool(more)


def read_history(r: Client, shards_or_qk: QueueKeys | Sequence[QueueKeys],
                 window_ms: int = 3_600_000, bucket_ms: int = 60_000) -> History:
    """A queue's activity over the last ``window_ms`` in buckets of ``bucket_ms``
    (both milliseconds; the window is rounded up to whole buckets), summed over the
    stats streams of all its shards, with rates per second and queue-wait percentiles
    per bucket and over the window. Reads only (XREVRANGE pages), bounded by
    MAX_ENTRIES; times are Redis's clock. ConfigError for a bad window or bucket."""
    shards = [shards_or_qk] if isinstance(shards_or_qk, QueueKeys) else list(shards_or_qk)
    if not shards:
        raise ConfigError("read_history needs the queue's shards (at least one)")
    for name, value in (("window_ms", window_ms), ("bucket_ms", bucket_ms)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{name} must be a positive integer of milliseconds, "
                              f"got {value!r}")
    n_rows = -(-window_ms // bucket_ms)
    if n_rows > MAX_ROWS:
        raise ConfigError(f"window_ms / bucket_ms gives {n_rows} buckets; at most {MAX_ROWS}")
    now = server_ms(r, shards[0].stats)
    span = n_rows * bucket_ms
    first = now - span
    rows = [_Acc() for _ in range(n_rows)]
    read, truncated = 0, False
    for qk in shards:
        entries, cut = _read_newest(r, qk.stats, first + 1, MAX_ENTRIES - read)
        truncated = truncated or cut
        read += len(entries)
        for entry_id, fields in entries:
            # (first, now]: an entry of a shard whose clock runs ahead goes in the last
            i = min((_entry_ms(entry_id) - first - 1) // bucket_ms, n_rows - 1)
            if i >= 0:
                rows[i].add(fields)
    whole = _Acc()
    for acc in rows:
        whole.merge(acc)
    return History(
        queue=shards[0].name, at_ms=now, window_ms=span, bucket_ms=bucket_ms,
        rows=[HistoryRow(start_ms=first + k * bucket_ms, **acc.rates(bucket_ms))
              for k, acc in enumerate(rows)],
        totals=HistoryTotals(**whole.rates(span)), entries=read, truncated=truncated)

