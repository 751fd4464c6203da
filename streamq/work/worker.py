"""The worker process: slots that serve a queue, and the heartbeat that keeps them.

A worker runs ``concurrency`` slots, each a thread (:mod:`streamq.slot`): a
slot claims a token, reads a batch of its job, runs the entries
(:mod:`streamq.entries`), acknowledges them and settles the token while
claiming the next. The main thread beats (:mod:`streamq.leases`): it keeps the
worker registered, extends the leases its slots hold and keeps their entries
fresh.

Redis blips are waited out: a worker started while Redis is down waits for
it, and transient errors (connection loss, OOM, BUSY, LOADING, READONLY,
MISCONF, TRYAGAIN, CLUSTERDOWN) are logged and retried with backoff; only
refused credentials or permissions stop it, or an unreachable Redis for longer
than ``redis_wait_s`` when that is given.

Sync handlers run in the slot threads; ``async def`` handlers run on one
event loop thread, ``concurrency`` of them at once: a few slots each claim
several tokens and run their entries as coroutines together. SIGTERM or
SIGINT drain: each slot finishes the sub-request it is running, hands back the
entries it read but did not start, releases its tokens, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

from streamq.base import config, hooks
from streamq.base.governor import Governor
from streamq.base.metrics import WorkerMetrics, WorkerStats
from streamq.base.running import current_task
from streamq.errors import ConnectionFailed
from streamq.producer.client import Queue, now_ms
from streamq.producer.rates import Limiter
from streamq.services.eviction import check_server
from streamq.services.history import ActivityCounter
from streamq.services.tracing import worker_tracer
from streamq.storage.connection import (
    Client,
    connect,
    connect_when_ready,
    is_access_error,
    is_transient,
    undecided,
    wait_for_redis,
)
from streamq.work.async_entries import AsyncEntries
from streamq.work.entries import EntryRunner
from streamq.work.leases import LeaseKeeper
from streamq.work.outcomes import Outcomes
from streamq.work.slot_threads import slot_threads

if TYPE_CHECKING:
    pass
from streamq.services.wakers import Wakers
from streamq.services.watchdog import Timeouts, Watchdog
from streamq.work.worker_options import WorkerOptions, check_handler

__all__ = ["Handler", "Worker", "WorkerOptions", "current_task"]

log = logging.getLogger("streamq.worker")

Handler = Callable[[Any], Any]
#: connections kept for the waker threads, one per shard (:mod:`streamq.wakers`)
_WAKER_CONNECTIONS = 64


def new_loop() -> asyncio.AbstractEventLoop:
    """The event loop of ``async def`` handlers: uvloop's when installed."""
    if os.environ.get("STREAMQ_UVLOOP", "1") != "0":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class Worker:
    """Serve one queue with ``handler(payload) -> result``."""

    def __init__(self, queue: str, handler: Handler, url: str | None = None, *,
                 client: Client | None = None, options: WorkerOptions | None = None,
                 **settings: Any) -> None:
        """``options`` (:class:`streamq.worker_options.WorkerOptions`), or its fields as
        keywords (``settings``, in place of those of ``options``)."""
        o = self.options = WorkerOptions.of(options, settings)
        check_handler(handler)
        self.is_async = inspect.iscoroutinefunction(handler)
        size = o.sizing(self.is_async)
        #: sub-requests in flight at once, the slot threads, and the most tokens
        #: (sub-requests in flight) one slot holds (see WorkerOptions.sizing)
        self.concurrency, self.slots, self.slot_share = size.concurrency, size.slots, size.slot_share
        #: how many slots serve, adapted to the work (None: all of them)
        self.governor = Governor(self.slots, self._finished) if size.adapt else None
        self._own_client = client is None
        self._url = url
        if client is None:
            if url is None:
                url = config.redis_url_from_env()
            client = connect(url, max_connections=self._pool_size)
        self._bind(queue, client)
        # what the worker's parts read, as their protocols name it
        self.batch, self.prefetch, self.lease_ms = o.batch, o.prefetch, o.lease_ms
        self.heartbeat_s, self.idle_wait_s, self.ack_flush_s = (
            o.heartbeat_s, o.idle_wait_s, o.ack_flush_s)
        self.stop_retry_s = o.stop_retry_s
        #: lifetime of the worker's description hash, ms
        self.info_ttl_ms = int(o.heartbeat_s * 3000) + 60_000
        #: tokens a stopping worker could not hand back (Redis unreachable)
        self.undrained = 0
        #: a slot gave up on Redis while stopping: the last beats and the deregistration
        #: are not tried (each would spend redis-py's retries on a Redis just given up on)
        self.gave_up = False
        self.id = o.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        #: OpenTelemetry spans per sub-request (streamq.tracing); None when off
        self.tracer = worker_tracer(o.tracing, self.id)
        self.handler = handler if self.tracer is None else self.tracer.wrap(handler)
        if self.governor is not None:  # all slots serve when slow handlers hold those serving
            self.handler = self.governor.timed(self.handler)
        self.metrics = WorkerMetrics(queue)
        self._init_state()

    def _init_state(self) -> None:
        """What the worker's threads share once it is configured: counts, the stop
        flag, the parts its slots use."""
        self.stats = WorkerStats()
        #: what the slots did, for the queue's stats stream (:mod:`streamq.history`)
        self.activity = ActivityCounter()
        #: set to drain and stop
        self.stopping = threading.Event()
        #: the event loop of ``async def`` handlers (None for a sync handler)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.started_ms = now_ms()
        hooks.install_from_env()  # (the crash tests' fault points: streamq.hooks)
        #: set when the worker stopped for good: Redis refused access, or stayed
        #: unreachable longer than ``redis_wait_s``
        self.fatal: str | None = None
        #: monotonic time Redis was first found unreachable since the last good beat
        self._down_since: float | None = None
        self.leases = LeaseKeeper(self)
        self.outcomes = Outcomes(self)
        self.async_entries = AsyncEntries(self)
        self.entries = EntryRunner(self)
        #: the jobs' handler timeouts, and the slots' handler threads for them
        self.timeouts = Timeouts(self.keys.name)
        self.watchdog = Watchdog()

    @cached_property
    def wakers(self) -> Wakers:
        """The waker threads of a queue of several shards (made once the shards are read)."""
        return Wakers(self)

    @cached_property
    def rates(self) -> Limiter:
        """The queue's rate limits as this worker applies them (:mod:`streamq.rates`)."""
        return Limiter(self)

    def _bind(self, queue: str, client: Client) -> None:
        self.q = Queue(queue, client=client, retention_s=self.options.retention_s,
                       shards=self.options.shards)
        self.redis = client
        self.scripts = self.q.scripts
        self.scripts.outlast_s = 0.0  # (its loops wait a refusing Redis out)
        self.keys = self.q.keys
        #: the queue's shards, read when the worker starts (:meth:`_load_shards`)
        self.shards = [self.keys]

    def _load_shards(self) -> bool:
        """Read (or choose, first use) the queue's shards; False on a Redis error (a
        corrupt configuration is raised)."""

        def load() -> None:
            self.shards = self.q.shards

        return self._redis_step(load, "reading the queue's shards", raise_other=True)

    def _redis_step(self, step: Callable[[], object], what: str, *,
                    raise_other: bool = False) -> bool:
        """Run ``step``; True when it went through. Transient errors are logged and
        waited out (up to ``redis_wait_s``); access errors stop the worker; any other
        error is raised (``raise_other``) or logged."""
        try:
            step()
        except Exception as e:
            if is_access_error(e):
                self.fatal_error(e)
            elif is_transient(e):
                self.unreachable(e)
                log.warning("%s failed: %s: %s", what, type(e).__name__, e)
            elif raise_other:
                raise
            else:
                log.exception("%s failed", what)
            return False
        return True

    # -- lifecycle ---------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to drain and return from :meth:`run`."""
        self.stopping.set()
        if self.governor is not None:
            self.governor.wake_all()

    def _finished(self) -> int:
        """Entries finished so far (processed or failed), for the governor."""
        return self.stats.processed + self.stats.failed

    def run(self) -> None:
        """Serve until :meth:`stop` (or SIGTERM/SIGINT when run in the main thread)."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._signalled)
        if not self._reach_redis():
            return
        check_server(self.redis, self.options.allow_eviction)
        port, addr = self.options.metrics_port, self.options.metrics_addr
        if port is not None:
            self.metrics.serve(port, addr)
        loop_thread = None
        if self.is_async:
            self.loop = new_loop()
            loop_thread = threading.Thread(target=self.loop.run_forever, name="streamq-loop",
                                           daemon=True)
            loop_thread.start()
        while not self._load_shards() and self.fatal is None and not self.stopping.is_set():
            self.stopping.wait(min(self.heartbeat_s, 1.0))
        while (self.fatal is None and not self.stopping.is_set() and not self._beat()):
            self.stopping.wait(min(self.heartbeat_s, 1.0))
        if self.fatal is not None:
            self._close(loop_thread)
            raise ConnectionFailed(self.fatal)
        self._write_id_file()
        self._serve(slot_threads(self))
        self._stopped(loop_thread)

    def _signalled(self, signum: int, _frame: object) -> None:
        """SIGTERM or SIGINT: the first drains (said at once: a warm shutdown), a second
        exits now (128 + the signal); what the worker held then goes to other workers
        once the reaper finds it stalled, as after a crash."""
        name = signal.Signals(signum).name
        if not self.stopping.is_set():
            log.warning("%s: warm shutdown: finishing the sub-requests running, handing "
                        "back what has not started; send %s again to stop at once", name,
                        name)
            self.stop()
            return
        log.warning("%s again: cold shutdown: exiting now; what this worker held is "
                    "handed to other workers once the reaper finds it stalled", name)
        logging.shutdown()
        os._exit(128 + signum)

    def _reach_redis(self) -> bool:
        """Wait until Redis answers (connecting again as it says, when the worker was
        made without knowing whether it is a cluster); False when stopped first."""
        try:
            if self._own_client and self._url is not None and undecided(self.redis):
                # Redis could not be asked whether it is a cluster when the worker was
                # made, or the cluster could not serve: wait, then connect as it says
                self.redis.close()
                self._bind(self.q.name, connect_when_ready(
                    self._url, log, max_wait_s=self.options.redis_wait_s, stop=self.stopping,
                    max_connections=self._pool_size))
            wait_for_redis(self.redis, log, max_wait_s=self.options.redis_wait_s, stop=self.stopping)
        except ConnectionFailed:
            if self.stopping.is_set() and self.fatal is None:
                log.info("worker %s stopped before Redis was reachable", self.id)
                return False
            raise
        return True

    def _serve(self, slots: list[threading.Thread]) -> None:
        """Start the slots, and beat until every one of them ended."""
        if len(self.shards) > 1:
            self.wakers.start()
        if self.governor is not None:
            self.governor.restart()
        for t in slots:
            t.start()
        log.info("worker %s serving queue %s (%d shard%s) with %d slots%s", self.id,
                 self.q.name, len(self.shards), "" if len(self.shards) == 1 else "s",
                 self.slots, f", {self.concurrency} sub-requests in flight at most"
                 if self.is_async else ", as many serving as serve best"
                 if self.governor is not None else "")
        # heartbeats (and lease extensions) go on while the slots drain
        while any(t.is_alive() for t in slots):
            self.stopping.wait(self.heartbeat_s)
            if self.stopping.is_set():
                for t in slots:
                    t.join(self.heartbeat_s / len(slots))
            if not self.gave_up:
                self._beat()

    def _stopped(self, loop_thread: threading.Thread | None) -> None:
        """The last beats, then close; ConnectionFailed when the worker stopped for good
        or left tokens to expire."""
        # the slots are done: what they did since the last counted beat goes out now
        # (a batch whose beat failed is sent again first, so up to two more beats)
        for _ in range(3):
            if (self.fatal is not None or self.gave_up or not self.activity.unsent()
                    or not self._beat()):
                break
        self._close(loop_thread)
        log.info("worker %s stopped after %d sub-requests", self.id, self.stats.processed)
        if self.fatal is not None:
            raise ConnectionFailed(self.fatal)
        if self.undrained:
            raise ConnectionFailed(
                f"Redis {'unreachable' if self.gave_up else 'failing'} for "
                f"{self.stop_retry_s:g} s while stopping: "
                f"up to {self.undrained} token(s) left to expire (nothing is lost: the reaper hands "
                "their entries to other workers)")

    def _close(self, loop_thread: threading.Thread | None) -> None:
        if self.loop is not None and loop_thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            loop_thread.join()
            self.loop.close()
        if self.gave_up:
            log.warning("not deregistering (Redis unreachable): the reaper counts this "
                        "worker gone once its heartbeat lapses")
        else:
            try:
                for qk in self.shards:
                    self.scripts.unregister(qk, self.id)
            except Exception as e:  # Redis down or refusing: the entries expire on their own
                log.warning("could not deregister: %s", e)
        path = self.options.id_path
        if path is not None:
            path.unlink(missing_ok=True)
        if self._own_client:
            self.redis.close()

    def _beat(self) -> bool:
        """One heartbeat; True when it went through. Transient errors are logged and
        waited out (up to ``redis_wait_s``); access errors stop the worker."""
        if not self._redis_step(self.leases.heartbeat, "heartbeat"):
            return False
        self._down_since = None
        return True

    def _write_id_file(self) -> None:
        """Tell ``streamq health --worker`` (same host or container) who this worker is."""
        path = self.options.id_path
        if path is None:
            return
        doc = {"worker_id": self.id, "queue": self.q.name, "heartbeat_s": self.heartbeat_s,
               "pid": os.getpid()}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)

    def fatal_error(self, e: BaseException) -> None:
        """Access refused (wrong credentials, a command the ACL forbids): stop, do not retry."""
        if self.fatal is None:
            self.fatal = f"Redis refused access: {e}"
            log.error("%s; stopping", self.fatal)
        self.stopping.set()

    def unreachable(self, e: BaseException) -> None:
        """Redis failed with a transient error; stop once it lasted past ``redis_wait_s``."""
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        elif (self.options.redis_wait_s is not None and now - self._down_since > self.options.redis_wait_s
              and self.fatal is None):
            self.fatal = f"cannot reach Redis after {now - self._down_since:.0f} s: {e}"
            log.error("%s; stopping", self.fatal)
            self.stopping.set()

    def pause(self, stopping: bool, seconds: float) -> None:
        """Wait before a retry, cut short by a stop; a fixed half second once stopping
        (the stop event is set then, so waiting on it would not pause at all)."""
        if stopping:
            time.sleep(min(seconds, 0.5))
        else:
            self.stopping.wait(seconds)

    def _retry_delay(self, e: Exception, attempt: int) -> int:
        """Milliseconds until the next attempt, or -1 to dead-letter at once."""
        return self.options.retry_delay(e, attempt)

    @property
    def _pool_size(self) -> int:
        """Connections the worker may open: two per slot thread (its calls, and its
        reads while the heartbeat runs), the main thread's, and the wakers'."""
        return self.slots * 2 + 4 + _WAKER_CONNECTIONS
