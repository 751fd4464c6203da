"""The jobs this process has seen cancelled (:meth:`streamq.Queue.cancel`).

A worker's heartbeat reads the state of every job whose entries its slots hold
and adds the cancelled ones here; a slot checks this set before it starts each
entry, and ``current_task().cancelled`` reads it. Bounded: the oldest ids go
first (a job id is never reused while its records live, and an entry of a
cancelled job is never delivered again, so a forgotten id costs nothing).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["add", "recent", "seen"]

#: ids kept at most
_CAP = 10_000
#: ids a heartbeat reports back (the newest), so a canceller sees they were noted
_RECENT = 64

_lock = threading.Lock()
_jobs: OrderedDict[str, None] = OrderedDict()


def add(job_ids: list[str]) -> None:
    """Note jobs seen cancelled."""
    with _lock:
        for job in job_ids:
            _jobs[job] = None
            _jobs.move_to_end(job)
        while len(_jobs) > _CAP:
            _jobs.popitem(last=False)


def seen(job_id: str) -> bool:
    """True once ``job_id`` was seen cancelled by this process."""
    return job_id in _jobs


def recent() -> list[str]:
    """The newest ids seen cancelled (at most 64)."""
    with _lock:
        return list(_jobs)[-_RECENT:]
