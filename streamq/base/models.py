"""Plain data types shared by the client, the worker and the CLI."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from streamq.base import cancels


class JobState(str, enum.Enum):
    """Where a job is in its life."""

    OPEN = "open"  #: streaming: a producer may still add sub-requests
    ACTIVE = "active"  #: finalized, sub-requests unfinished
    #: scheduled for later (``submit(delay=...)``/``at=``): none of its sub-requests is
    #: ready yet; a status only (the job's meta says active or open)
    SCHEDULED = "scheduled"
    SUCCEEDED = "succeeded"  #: every sub-request has a result
    PARTIAL = "partial"  #: some sub-requests were dead-lettered
    FAILED = "failed"  #: every sub-request was dead-lettered
    ABORTED = "aborted"  #: stopped by its producer (a failed Spark write); no more work is done
    #: cancelled (``Queue.cancel``): nothing of it starts any more; what ran keeps its result
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.PARTIAL, JobState.FAILED,
                             JobState.ABORTED, JobState.CANCELLED})


@dataclass(frozen=True)
class JobStatus:
    """A snapshot of one job, as :meth:`streamq.Queue.status` reads it."""

    job_id: str
    queue: str
    state: JobState
    priority: int
    concurrency: int
    client: str
    total: int  #: sub-requests added so far
    done: int  #: acknowledged with a stored result
    failed: int  #: dead-lettered
    in_flight: int  #: delivered to a worker and not yet acknowledged
    queued: int  #: waiting to be delivered (including scheduled retries)
    created_ms: int
    finished_ms: int | None
    #: a scheduled job's time, ms since the epoch by Redis's clock (None: not scheduled)
    due_ms: int | None = None
    #: each handler run's limit on one of its sub-requests, seconds (None: none)
    timeout_s: float | None = None

    @property
    def terminal(self) -> bool:
        """True once the job is succeeded, partial, failed, aborted or cancelled."""
        return self.state in TERMINAL_STATES

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        d = dict(self.__dict__)
        d["state"] = self.state.value
        return d


@dataclass(frozen=True)
class Completion:
    """The single completion record of a job."""

    job_id: str
    queue: str
    state: JobState
    total: int
    done: int
    failed: int
    finished_ms: int

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (also the message published on the channels)."""
        d = dict(self.__dict__)
        d["state"] = self.state.value
        return d

    def message(self) -> str:
        """:meth:`as_dict` as compact JSON: the message published on the channels."""
        return completion_message(self.job_id, self.queue, self.state.value, self.total,
                                  self.done, self.failed, self.finished_ms)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Completion:
        """Build from :meth:`as_dict` output."""
        return cls(
            job_id=str(d["job_id"]),
            queue=str(d["queue"]),
            state=JobState(d["state"]),
            total=int(d["total"]),
            done=int(d["done"]),
            failed=int(d["failed"]),
            finished_ms=int(d["finished_ms"]),
        )


@dataclass(frozen=True)
class Task:
    """The sub-request a handler is running (see :func:`streamq.current_task`)."""

    queue: str
    job_id: str
    index: int
    entry_id: str
    attempt: int
    #: when the run must end (its job's timeout), seconds since the epoch by the
    #: worker's clock; None when the job has no timeout
    deadline: float | None = None

    @property
    def cancelled(self) -> bool:
        """True once this worker has seen the job cancelled (``Queue.cancel``): the
        handler may stop early; what it returns is still stored."""
        return cancels.seen(self.job_id)


_STATE_VALUES = frozenset(s.value for s in JobState)


def completion_message(job_id: str, queue: str, state: str, total: int, done: int,
                       failed: int, finished_ms: int) -> str:
    """The compact JSON of a completion, as ``Completion(...).as_dict()`` gives it,
    built directly (a worker builds one per finished job). Job ids and queue names
    are checked names (``A-Z a-z 0-9 _ . : -``), so they need no JSON escaping."""
    if state not in _STATE_VALUES:
        raise ValueError(f"{state!r} is not a job state")
    return (f'{{"job_id":"{job_id}","queue":"{queue}","state":"{state}","total":{int(total)},'
            f'"done":{int(done)},"failed":{int(failed)},"finished_ms":{int(finished_ms)}}}')
