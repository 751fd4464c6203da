"""APScheduler glue: the only module that imports apscheduler."""

from __future__ import annotations

import logging
import signal
import threading
from datetime import datetime

from apscheduler.schedulers.base import SchedulerNotRunningError
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.interval import IntervalTrigger

from .connection import is_access_error, is_transient, wait_for_redis
from .errors import ConnectionFailed
from .functions import LibraryMissing, ensure
from .reaper import Reaper

log = logging.getLogger("streamq.scheduler")


class _OnlyAtDebug(logging.Filter):
    """APScheduler's two INFO lines per run ("Running job", "executed successfully")
    pass only when the process logs at DEBUG; its warnings and errors always pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or logging.getLogger().isEnabledFor(logging.DEBUG)


for _name in ("apscheduler.executors.default", "apscheduler.scheduler"):
    logging.getLogger(_name).addFilter(_OnlyAtDebug())

_JOB = "reaper"


def run_reaper(reaper: Reaper, interval_s: float, *, redis_wait_s: float | None = None) -> None:
    """Run the reaper's passes every ``interval_s`` (with 10% jitter) until SIGTERM/SIGINT.

    One pass at a time (``max_instances=1``); missed runs are coalesced. Redis is
    waited for before the first pass, and again after a pass that a transient error
    cut short (unreachable, OOM, BUSY, LOADING, ...: one line, then one per failed
    attempt, with backoff), the schedule paused meanwhile.

    Raises ConnectionFailed when Redis refuses access (wrong password, NOPERM) or
    stays unreachable for longer than ``redis_wait_s`` (forever when None); returns
    when stopped by a signal.
    """
    scheduler = BlockingScheduler(timezone="UTC")
    stop = threading.Event()
    fatal: list[Exception] = []

    def halt() -> None:
        stop.set()
        try:
            scheduler.shutdown(wait=False)
        except SchedulerNotRunningError:
            pass

    def wait() -> bool:
        """Wait for Redis; False when stopping (by a signal, or giving up)."""
        try:
            wait_for_redis(reaper.redis, log, max_wait_s=redis_wait_s, stop=stop)
            return True
        except ConnectionFailed as e:
            if not stop.is_set():
                fatal.append(e)
                halt()
            return False

    def tick() -> None:
        if stop.is_set():  # a signal that came before the scheduler ran
            halt()
            return
        try:
            reaper.run_once()
        except Exception as e:
            if isinstance(e, LibraryMissing):  # what to run is in its message
                fatal.append(e)
                halt()
            elif is_access_error(e):
                fatal.append(ConnectionFailed(f"Redis refused access: {e}"))
                halt()
            elif is_transient(e):
                log.warning("reaper pass cut short: %s: %s", type(e).__name__, e)
                if stop.is_set():
                    return
                scheduler.pause_job(_JOB)
                if wait():
                    scheduler.resume_job(_JOB)
            else:
                log.exception("reaper pass failed; next pass in %.1f s", interval_s)

    if threading.current_thread() is threading.main_thread():
        def on_signal(*_: object) -> None:
            stop.set()
            try:
                scheduler.shutdown(wait=True)
            except SchedulerNotRunningError:
                pass

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    if wait():
        try:
            ensure(reaper.redis)
        except LibraryMissing:
            raise
        except Exception as e:  # a transient error: the first pass meets it again
            log.warning("could not check streamq's functions library now (%s)", e)
        scheduler.add_job(tick, IntervalTrigger(seconds=interval_s, jitter=interval_s * 0.1),
                          id=_JOB, coalesce=True, max_instances=1,
                          next_run_time=datetime.now().astimezone())
        log.info("reaper for queue %s every %.1f s", reaper.q.name, interval_s)
        if not stop.is_set():
            scheduler.start()
    if fatal:
        raise fatal[0]
