"""APScheduler glue: the only module that imports apscheduler."""

from __future__ import annotations

import logging
import signal
import threading
from datetime import datetime

from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.interval import IntervalTrigger

from .connection import CONNECTION_ERRORS
from .reaper import Reaper

log = logging.getLogger("streamq.scheduler")


def run_reaper(reaper: Reaper, interval_s: float) -> None:
    """Run the reaper's passes every ``interval_s`` (with 10% jitter) until SIGTERM/SIGINT.

    One pass at a time (``max_instances=1``); missed runs are coalesced.
    A pass that finds Redis unreachable logs and waits for the next one.
    """
    scheduler = BlockingScheduler(timezone="UTC")

    def tick() -> None:
        try:
            reaper.run_once()
        except CONNECTION_ERRORS as e:
            log.warning("redis unavailable (%s); next pass in %.1f s", e, interval_s)

    scheduler.add_job(tick, IntervalTrigger(seconds=interval_s, jitter=interval_s * 0.1),
                      id="reaper", coalesce=True, max_instances=1,
                      next_run_time=datetime.now().astimezone())
    if threading.current_thread() is threading.main_thread():
        def stop(*_: object) -> None:
            scheduler.shutdown(wait=True)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
    log.info("reaper for queue %s every %.1f s", reaper.q.name, interval_s)
    scheduler.start()
