"""A worker's options: one typed, checked object (:class:`WorkerOptions`), and the
sizes a worker derives from it for its handler (:class:`Sizing`).

``Worker("images", handle, url, options=WorkerOptions(batch=100))``, or the same
options as keywords: ``Worker("images", handle, url, batch=100)``.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamq.base import config
from streamq.errors import ConfigError, NonRetryable, RetryLater

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker serves its queue. Every value is checked when the object is made
    (ConfigError names the option)."""

    #: sub-requests in flight at once; None: the default for the handler's kind (sync:
    #: DEFAULT_WORKER_CONCURRENCY slots, of which a governor adapts how many serve;
    #: ``async def``: DEFAULT_ASYNC_CONCURRENCY)
    concurrency: int | None = None
    #: entries read per XREADGROUP; 0: each slot adapts it to the work
    batch: int = config.DEFAULT_BATCH
    #: tokens a slot claims per round trip; 0: each slot adapts it to the work
    prefetch: int = config.DEFAULT_PREFETCH
    #: how long a claimed token is the slot's without a heartbeat, ms
    lease_ms: int = config.DEFAULT_LEASE_MS
    #: seconds between heartbeats (leases extended, held entries kept fresh)
    heartbeat_s: float = config.DEFAULT_HEARTBEAT_S
    #: the longest a slot with nothing to do blocks on the wake list, seconds
    idle_wait_s: float = config.DEFAULT_IDLE_WAIT_S
    #: results of a long batch are acknowledged at least this often, seconds
    ack_flush_s: float = config.DEFAULT_ACK_FLUSH_S
    #: the worker's id (default: host, pid and a random suffix)
    worker_id: str | None = None
    #: how long a finished job's records are kept, seconds
    retention_s: float = config.DEFAULT_RETENTION_S
    #: the first retry's delay and the longest, seconds (doubling, with jitter)
    retry_base_s: float = config.DEFAULT_RETRY_BASE_S
    retry_cap_s: float = config.DEFAULT_RETRY_CAP_S
    #: serve Prometheus metrics on this port (None: no endpoint)
    metrics_port: int | None = None
    metrics_addr: str = "0.0.0.0"
    #: how long a stopping worker keeps trying to hand back what it holds, seconds
    stop_retry_s: float = config.DEFAULT_STOP_RETRY_S
    #: give up (ConnectionFailed) once Redis was unreachable this long; None: never
    redis_wait_s: float | None = None
    #: a file naming the live worker (written at start, removed at exit)
    id_file: str | os.PathLike[str] | None = None
    #: the shard count asked for when the worker is the queue's first user
    shards: int | None = None
    #: start even when Redis may evict keys (its maxmemory-policy), with a warning
    allow_eviction: bool = False
    #: OpenTelemetry spans per sub-request (None: as STREAMQ_TRACING says, else on
    #: when a tracer provider is set; see :mod:`streamq.tracing`)
    tracing: bool | TracerProvider | None = None

    def __post_init__(self) -> None:
        for name, value, lo in (("batch", self.batch, 0), ("prefetch", self.prefetch, 0),
                                ("lease_ms", self.lease_ms, 100)):
            _check_int(name, value, lo)
        if self.concurrency is not None:
            _check_int("concurrency", self.concurrency, 1)
        if not 0 < self.idle_wait_s < config.DEFAULT_SOCKET_TIMEOUT_S:
            raise ConfigError("idle_wait_s must be positive and below the socket timeout")
        for name, zero_too in (("heartbeat_s", False), ("retention_s", False),
                               ("ack_flush_s", True), ("retry_base_s", True),
                               ("retry_cap_s", True), ("stop_retry_s", True)):
            value = getattr(self, name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or value < 0 or (value == 0 and not zero_too)):
                raise ConfigError(f"{name} must be a number {'>= 0' if zero_too else 'above 0'}"
                                  f", got {value!r}")
        if self.redis_wait_s is not None and not self.redis_wait_s >= 0:
            raise ConfigError(f"redis_wait_s must be >= 0, got {self.redis_wait_s!r}")

    @classmethod
    def of(cls, options: WorkerOptions | None, settings: dict[str, Any]) -> WorkerOptions:
        """``options`` (default: the defaults) with ``settings`` (option names and
        values) in place of its own; ConfigError naming an unknown option."""
        unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(f"unknown worker option(s): {', '.join(unknown)}")
        return dataclasses.replace(options or cls(), **settings)

    @property
    def id_path(self) -> Path | None:
        return None if self.id_file is None else Path(self.id_file)

    def sizing(self, is_async: bool) -> Sizing:
        """The concurrency, slot threads and share per slot of a worker whose handler
        is ``async def`` (``is_async``) or not."""
        concurrency = self.concurrency
        if concurrency is None:
            concurrency = (config.DEFAULT_ASYNC_CONCURRENCY if is_async
                           else config.DEFAULT_WORKER_CONCURRENCY)
        slots = min(concurrency, config.ASYNC_SLOTS) if is_async else concurrency
        return Sizing(concurrency, slots, -(-concurrency // slots),
                      adapt=self.concurrency is None and not is_async and slots > 1)

    def retry_delay(self, e: Exception, attempt: int) -> int:
        """Milliseconds until the next attempt after ``e`` on attempt ``attempt``, or -1
        to dead-letter at once (NonRetryable)."""
        if isinstance(e, NonRetryable):
            return -1
        if isinstance(e, RetryLater):
            return max(0, int(e.delay_s * 1000))
        delay = min(self.retry_cap_s, self.retry_base_s * 2 ** (attempt - 1))
        return int(delay * 1000 * random.uniform(0.5, 1.0))


@dataclass(frozen=True)
class Sizing:
    """What a worker runs at once: sub-requests in flight (``concurrency``: one per slot
    thread for a sync handler; for an async one, coroutines run by ASYNC_SLOTS slots,
    each up to ``slot_share``), its slot threads, and whether a governor adapts how
    many slots serve (a sync worker given no concurrency)."""

    concurrency: int
    slots: int
    slot_share: int
    adapt: bool


def _check_int(name: str, value: object, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ConfigError(f"{name} must be an integer >= {lo}, got {value!r}")


def check_handler(handler: Callable[..., Any]) -> None:
    """ConfigError unless ``handler`` can be called with one argument (the payload): a
    wrong signature would fail every sub-request, so the worker does not start."""
    if not callable(handler):
        raise ConfigError(f"the handler {handler!r} is not callable")
    try:
        sig = inspect.signature(handler)
    except (TypeError, ValueError):  # no signature to read (a builtin): called as it is
        return
    try:
        sig.bind(None)
    except TypeError:
        name = getattr(handler, "__qualname__", repr(handler))
        raise ConfigError(f"the handler {name}{sig} must take one argument, the "
                          "payload") from None
