"""What every reaper pass shares, below both the job pass (:mod:`streamq.reaper`) and
the small-job lane pass (:mod:`streamq.lane_reaper`): the pass's report, and what a pass
reads of a stream (its undelivered entries) and tidies in it (the consumers of dead
workers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis

from streamq.base import config
from streamq.base.keys import JobKeys
from streamq.model.scripts import Scripts
from streamq.storage.connection import Client, is_access_error, is_transient


@dataclass
class PassReport:
    """What one run of every pass did."""

    leases_returned: int = 0
    dead_workers: list[str] = field(default_factory=list)
    jobs_checked: int = 0
    reclaimed: int = 0
    dead_lettered: int = 0
    retries_promoted: int = 0
    finished: int = 0
    orphans: int = 0
    consumers_deleted: int = 0
    #: dead letters this pass copied to the dead stream (announcements owed by a crash)
    announced: int = 0
    #: intents of dead producers' submits: jobs registered, jobs finished, intents dropped
    intents_registered: int = 0
    intents_finished: int = 0
    intents_dropped: int = 0
    skipped: bool = False  #: another reaper held the lock
    #: jobs whose recovery failed with an error Redis or the job's data caused (logged)
    job_errors: list[str] = field(default_factory=list)
    #: sub-requests waiting for delivery (stream lag plus scheduled retries), by priority
    backlog: dict[int, int] = field(default_factory=dict)
    #: unfinished small jobs (:mod:`streamq.lane`)
    lane_active: int = 0
    #: jobs submitted for the due ticks of repeats (:mod:`streamq.reaping.ticker`)
    repeats_submitted: int = 0

    def summary(self) -> str:
        """What the pass changed, in words (the counts that are not 0), for its log line."""
        parts = [f"{n} {what}" for n, what in (
            (self.leases_returned, "expired leases returned"),
            (self.reclaimed, "stalled entries handed to other workers"),
            (self.dead_lettered, "entries dead-lettered after their last delivery"),
            (self.retries_promoted, "retries promoted"),
            (self.finished, "jobs finished"), (self.orphans, "orphaned jobs dropped"),
            (self.announced, "dead letters announced"),
            (self.intents_registered, "interrupted submits registered"),
            (self.intents_finished, "interrupted submits finished"),
            (self.intents_dropped, "intents dropped"),
            (self.consumers_deleted, "consumers of gone workers deleted"),
            (self.repeats_submitted, "repeating jobs submitted")) if n]
        if self.dead_workers:
            parts.append(f"workers presumed dead: {', '.join(self.dead_workers)}")
        if self.job_errors:
            parts.append(f"{len(self.job_errors)} jobs could not be checked (logged)")
        return "; ".join(parts) or "nothing to do"


def undelivered(client: Client, jk: JobKeys | str) -> int:
    """Entries of a job's stream (or a lane's, by key) not yet delivered to any worker
    (XINFO GROUPS lag)."""
    stream = jk if isinstance(jk, str) else jk.tasks
    try:
        groups: Any = client.xinfo_groups(stream)
    except redis.ResponseError as e:
        if is_transient(e) or is_access_error(e):
            raise
        return 0  # no stream
    for g in groups:
        lag = g.get("lag")
        return int(lag) if lag is not None else int(client.xlen(stream))
    return 0


def delete_idle_consumers(client: Client, scripts: Scripts, jk: JobKeys | str,
                          alive: set[str], min_idle_ms: int) -> int:
    """Delete consumers of dead workers (and the reaper's own) once nothing is pending.

    The list read here only picks candidates; ``delete_consumers`` checks again, in
    the call that deletes, that each has nothing pending and was idle for
    ``min_idle_ms``, so an entry read under a candidate's name meanwhile is kept.
    """
    stream = jk if isinstance(jk, str) else jk.tasks
    try:
        consumers: Any = client.xinfo_consumers(stream, config.GROUP)
    except redis.ResponseError as e:
        if is_transient(e) or is_access_error(e):
            raise
        return 0  # no stream or no group: nothing to delete
    names = []
    for c in consumers:
        name = c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
        if c["pending"] == 0 and int(c["idle"]) >= min_idle_ms and name not in alive:
            names.append(name)
    return scripts.delete_consumers(jk, names, min_idle_ms)
