"""The jobs this process has seen cancelled (:meth:`streamq.Queue.cancel`).

A worker's heartbeat reads the state of every job whose entries its slots hold
and adds the cancelled ones here; a slot checks this set before it starts each
entry, and ``current_task().cancelled`` reads it. Bounded: the oldest ids go
first (a job id is never reused while its records live, and an entry of a
cancelled job is never delivered again, so a forgotten id costs nothing).

The check and the start are one step to a canceller: a slot notes the job it is
about to start (:func:`begin`) before it looks here, and clears the note as it calls
the handler (:func:`started`); a beat lists (:func:`listable`) no job a slot is
starting. The beat adds before it lists, and the slot notes before it looks, so
either the slot sees the cancel, or the beat sees the note and lists the job at a
later beat, once the handler was called: a cancel that returns complete was seen by
every start that follows it. (Each side writes, then reads what the other wrote; the
interpreter runs one thread's bytecode at a time, so one of the two reads sees the
other's write.)
"""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["add", "begin", "listable", "recent", "seen", "started"]

#: ids kept at most
_CAP = 10_000
#: ids a heartbeat reports back (the newest), so a canceller sees they were noted
_RECENT = 64

_lock = threading.Lock()
_jobs: OrderedDict[str, None] = OrderedDict()
#: thread ident -> the job that thread checked and is about to start an entry of
_starting: dict[int, str] = {}


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


def begin(job_id: str, me: int) -> bool:
    """Thread ``me`` (its ident) is about to start an entry of ``job_id``: True when the
    job was seen cancelled (start none of it). Either way the thread is noted as
    starting the job until :func:`started`, which it must call next."""
    _starting[me] = job_id  # the note first, then the look (see the module's docstring)
    return job_id in _jobs


def started(me: int) -> None:
    """Thread ``me`` calls its handler now, or starts nothing: its note goes."""
    _starting.pop(me, None)


def listable(job_ids: list[str]) -> list[str]:
    """``job_ids`` (cancelled, to be listed by a beat) but those a thread is starting: a
    beat lists them later, once their handler was called."""
    busy = set(_starting.copy().values())
    return [job for job in job_ids if job not in busy]
