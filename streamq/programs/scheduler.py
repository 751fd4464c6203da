"""APScheduler glue: the only module that runs an APScheduler scheduler (the repeats'
cron expressions are read with its cron trigger, :mod:`streamq.services.repeats`)."""

from __future__ import annotations

import logging
import signal
import threading
from datetime import datetime

from apscheduler.schedulers.base import SchedulerNotRunningError
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.interval import IntervalTrigger

from streamq.base import config
from streamq.errors import ConnectionFailed
from streamq.reaping.reaper import Reaper
from streamq.storage.connection import is_access_error, is_transient, wait_for_redis
from streamq.storage.functions import LibraryMissing, ensure

log = logging.getLogger("streamq.scheduler")


class _OnlyAtDebug(logging.Filter):
    """APScheduler's two INFO lines per run ("Running job", "executed successfully")
    pass only when the process logs at DEBUG; its warnings and errors always pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or logging.getLogger().isEnabledFor(logging.DEBUG)


for _name in ("apscheduler.executors.default", "apscheduler.scheduler"):
    logging.getLogger(_name).addFilter(_OnlyAtDebug())

_JOB = "reaper"
_TICKS = "repeats"


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
    _Schedule(reaper, interval_s, redis_wait_s).run()


class _Schedule:
    """The reaper's passes on an APScheduler loop, and what stops it."""

    def __init__(self, reaper: Reaper, interval_s: float, redis_wait_s: float | None) -> None:
        self.reaper, self.interval_s, self.redis_wait_s = reaper, interval_s, redis_wait_s
        self.scheduler = BlockingScheduler(timezone="UTC")
        self.stop = threading.Event()
        self.fatal: list[Exception] = []

    def halt(self) -> None:
        self.stop.set()
        try:
            self.scheduler.shutdown(wait=False)
        except SchedulerNotRunningError:
            pass

    def wait(self) -> bool:
        """Wait for Redis; False when stopping (by a signal, or giving up)."""
        try:
            wait_for_redis(self.reaper.redis, log, max_wait_s=self.redis_wait_s, stop=self.stop)
            return True
        except ConnectionFailed as e:
            if not self.stop.is_set():
                self.fatal.append(e)
                self.halt()
            return False

    def tick(self) -> None:
        if self.stop.is_set():  # a signal that came before the scheduler ran
            self.halt()
            return
        try:
            self.reaper.run_once()
        except Exception as e:
            if isinstance(e, LibraryMissing):  # what to run is in its message
                self.fatal.append(e)
                self.halt()
            elif is_access_error(e):
                self.fatal.append(ConnectionFailed(f"Redis refused access: {e}"))
                self.halt()
            elif is_transient(e):
                log.warning("reaper pass cut short: %s: %s", type(e).__name__, e)
                if self.stop.is_set():
                    return
                self.scheduler.pause_job(_JOB)
                if self.wait():
                    self.scheduler.resume_job(_JOB)
            else:
                log.exception("reaper pass failed; next pass in %.1f s", self.interval_s)

    def tick_repeats(self) -> None:
        """Submit the due repeats between passes; an error is the next pass's to report
        (and wait out), so it is logged at DEBUG here, unless no pass would meet it."""
        if self.stop.is_set():
            return
        try:
            self.reaper.tick_repeats()
        except Exception as e:
            if is_transient(e) or is_access_error(e) or isinstance(e, LibraryMissing):
                log.debug("repeats not ticked now: %s: %s", type(e).__name__, e)
            else:
                log.exception("submitting due repeats failed; next try in %.1f s", config.REPEAT_TICK_S)

    def on_signal(self, *_: object) -> None:
        self.stop.set()
        try:
            self.scheduler.shutdown(wait=True)
        except SchedulerNotRunningError:
            pass

    def run(self) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.on_signal)
            signal.signal(signal.SIGINT, self.on_signal)
        if self.wait():
            try:
                ensure(self.reaper.redis)
            except LibraryMissing:
                raise
            except Exception as e:  # a transient error: the first pass meets it again
                log.warning("could not check streamq's functions library now (%s)", e)
            interval_s = self.interval_s
            self.scheduler.add_job(self.tick, IntervalTrigger(seconds=interval_s,
                                                              jitter=interval_s * 0.1),
                                   id=_JOB, coalesce=True, max_instances=1,
                                   next_run_time=datetime.now().astimezone())
            self.scheduler.add_job(self.tick_repeats,
                                   IntervalTrigger(seconds=min(config.REPEAT_TICK_S, interval_s)),
                                   id=_TICKS, coalesce=True, max_instances=1)
            log.info("reaper for queue %s every %.1f s", self.reaper.q.name, interval_s)
            if not self.stop.is_set():
                self.scheduler.start()
        if self.fatal:
            raise self.fatal[0]
