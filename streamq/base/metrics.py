"""Prometheus metrics of a worker or reaper process (prometheus-client).

Each Worker or Reaper owns a registry, served over HTTP when a port is given
(``--metrics-port``). Names follow Prometheus conventions: ``_total`` for
counters, base units (seconds) in histogram names, a ``queue`` label.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from streamq.errors import ConfigError

#: Histogram buckets for handler duration and queue wait, in seconds.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


def serve(registry: CollectorRegistry, port: int, addr: str) -> None:
    """Serve ``registry`` on ``addr:port``; ConfigError when the port cannot be bound."""
    try:
        start_http_server(port, addr=addr, registry=registry)
    except OSError as e:
        raise ConfigError(f"cannot serve metrics on {addr}:{port}: {e.strerror or e}") from None


class BatchHistogram(Collector):
    """A histogram with one label value, fed a batch of observations per lock.

    A worker observes two values per sub-request; prometheus-client's
    Histogram takes a lock and walks the buckets for each one. This one takes
    the batch a worker slot gathered over one round and adds it under one
    lock. Exposed exactly like a Histogram (``_bucket``, ``_count``, ``_sum``).
    """

    def __init__(self, name: str, doc: str, label: str, value: str,
                 buckets: tuple[float, ...], registry: CollectorRegistry) -> None:
        self.name, self.doc, self.label, self.value = name, doc, label, value
        self.bounds = [float(b) for b in buckets]
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, value: float) -> None:
        self.observe_many((value,))

    def observe_many(self, values: Iterable[float]) -> None:
        """Count ``values`` in their buckets (a value equal to a bound is in that bound's
        bucket, as in Prometheus): sorted once, then one bisect per bound, so a batch
        of a thousand costs a sort in C instead of a thousand Python steps."""
        ordered = sorted(values)
        if not ordered:
            return
        total = sum(ordered)
        with self._lock:
            counts, below = self.counts, 0
            for i, bound in enumerate(self.bounds):
                upto = bisect_right(ordered, bound, below)
                counts[i] += upto - below
                below = upto
            counts[-1] += len(ordered) - below
            self.sum += total

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            counts, total = list(self.counts), self.sum
        family = HistogramMetricFamily(self.name, self.doc, labels=[self.label])
        cumulative, buckets = 0, []
        for bound, n in zip([*map(str, self.bounds), "+Inf"], counts):
            cumulative += n
            buckets.append((bound, cumulative))
        family.add_metric([self.value], buckets, total)
        yield family


class WorkerMetrics:
    """Counters and histograms a worker updates as it runs sub-requests."""

    def __init__(self, queue: str) -> None:
        self.registry = CollectorRegistry()
        r, q = self.registry, {"queue": queue}

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["queue"], registry=r).labels(**q)

        self.processed = counter("streamq_subrequests_processed_total",
                                 "Sub-requests whose result was acknowledged by this worker.")
        self.failed = counter("streamq_subrequests_failed_total",
                              "Handler attempts that raised (each attempt counts).")
        self.retried = counter("streamq_subrequests_retried_total",
                               "Failed attempts scheduled for another attempt.")
        self.dead_lettered = counter("streamq_subrequests_dead_lettered_total",
                                     "Sub-requests this worker moved to the dead-letter store.")
        self.timed_out = counter("streamq_handler_timeouts_total",
                                 "Handler attempts given up at their job's timeout (also "
                                 "counted as failed).")
        self.handler_seconds = BatchHistogram(
            "streamq_handler_duration_seconds", "Time spent in the handler per attempt.",
            "queue", queue, BUCKETS, r)
        self.wait_seconds = BatchHistogram(
            "streamq_queue_wait_seconds",
            "Time from a sub-request's enqueueing (its stream entry id) to its handler start.",
            "queue", queue, BUCKETS, r)
        self.leases = Gauge("streamq_leases", "Tokens this worker holds a lease on.", ["queue"],
                            registry=r).labels(**q)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve /metrics on ``addr:port`` from a daemon thread."""
        serve(self.registry, port, addr)


class ReaperMetrics:
    """What the reaper's passes recovered, and the backlog they saw."""

    def __init__(self, queue: str) -> None:
        self.registry = CollectorRegistry()
        r, q = self.registry, {"queue": queue}
        self.reclaimed = Counter("streamq_reclaimed_total",
                                 "Stalled entries handed to another worker.", ["queue"],
                                 registry=r).labels(**q)
        self.dead_lettered = Counter("streamq_reaper_dead_lettered_total",
                                     "Entries the reaper dead-lettered.", ["queue"],
                                     registry=r).labels(**q)
        self.leases_returned = Counter("streamq_leases_returned_total",
                                       "Expired or orphaned leases returned to ready.", ["queue"],
                                       registry=r).labels(**q)
        self.passes = Counter("streamq_reaper_passes_total", "Reaper passes run.", ["queue"],
                              registry=r).labels(**q)
        self.backlog = Gauge("streamq_backlog", "Sub-requests waiting for delivery, by priority.",
                             ["queue", "priority"], registry=r)
        self.active_jobs = Gauge("streamq_active_jobs", "Unfinished jobs.", ["queue"],
                                 registry=r).labels(**q)
        self.queue = queue

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve /metrics on ``addr:port`` from a daemon thread."""
        serve(self.registry, port, addr)


@dataclass
class WorkerStats:
    """What a worker's slots did, counted under its lock (its log line and tests read it)."""

    processed: int = 0
    failed: int = 0
    #: settles that claimed at least one token, and the tokens they claimed
    claims: int = 0
    tokens: int = 0
    #: the entries each slot's next read asks for (by slot index)
    reads: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
