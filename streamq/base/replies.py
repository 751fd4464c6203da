"""Script replies and error codes: what streamq's Lua returns, parsed into plain tuples.

Negative integer replies are streamq's error codes, mapped to exceptions in
:func:`raise_for_code`.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

from streamq.errors import ConfigError, JobClosed, JobNotFound, ScriptError


class ScriptErrorCode(enum.IntEnum):
    """Mirror of ``lua/includes/errors.lua``."""

    JOB_NOT_FOUND = -1
    JOB_CLOSED = -2
    TOTAL_MISMATCH = -3
    JOB_FINISHED = -4
    NOT_DEAD = -5
    NOT_WRITER = -6
    ROW_CHANGED = -7
    DUPLICATE_ID = -8
    AT_PAST = -9
    NOT_FINISHED = -10
    NOTHING_TO_RETRY = -11
    NO_REPEAT = -12
    TICK_PAST = -13


def raise_for_code(script: str, reply: Any, job_id: str | None = None) -> None:
    """Raise the exception an error-code reply stands for; do nothing otherwise."""
    if not isinstance(reply, int) or reply >= 0:
        return
    if reply == ScriptErrorCode.JOB_NOT_FOUND and job_id is not None:
        raise JobNotFound(job_id)
    if reply == ScriptErrorCode.JOB_CLOSED:
        raise JobClosed(f"job {job_id!r} is finalized: no sub-request can be added")
    if reply == ScriptErrorCode.NOT_FINISHED:
        raise ConfigError(f"job {job_id!r} has not finished: cancel it first (or delete it "
                          "with cancel: Queue.delete(job, cancel=True), streamq delete "
                          "--cancel)")
    if reply == ScriptErrorCode.NOTHING_TO_RETRY:
        raise ConfigError(f"job {job_id!r} has nothing to retry: it did not fail, or its "
                          "dead letters were replayed")
    if reply == ScriptErrorCode.AT_PAST:
        raise ConfigError("the time the job was scheduled at is already past by Redis's "
                          "clock: nothing was submitted")
    raise ScriptError(script, reply, f"error code {reply}", job_id)


def new_token() -> str:
    """A random token (64 bits, hex) naming one write, so the write resent after a lost
    reply is recognised as the same write."""
    return os.urandom(8).hex()


def s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class JobReply(NamedTuple):
    """A job as a job-slot script left it (a tuple: made for every job a worker acks)."""

    completed: bool  #: this call made the job terminal: finish it in the queue's hash slot
    state: str
    total: int
    done: int
    failed: int
    concurrency: int
    dedup: str
    priority: int = 0
    client: str = ""
    created_ms: int = 0
    retention_ms: int = 0
    #: tells this job from an earlier one of the same id (create_job-6.lua)
    incarnation: str = ""
    #: dead letters the job recorded (replayed and malformed ones included): when
    #: above 0, finishing the job marks it as possibly owing announcements
    dead: int = 0
    #: a scheduled job's time (ms, Redis's clock): its sub-requests wait until then
    due_ms: int = 0

    @classmethod
    def parse(cls, r: Sequence[Any]) -> JobReply:
        return cls(r[0] == 1, s(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), s(r[6]),
                   int(r[7]), s(r[8]), int(r[9]), int(r[10]),
                   s(r[11]) if len(r) > 11 and r[11] is not None else "",
                   int(r[12] or 0) if len(r) > 12 else 0,
                   int(r[13] or 0) if len(r) > 13 else 0)


class JobMeta(NamedTuple):
    """What an announce needs of a job: its state ("" when gone), retention and
    creation time (ms; with the id, it names this incarnation of the job)."""

    state: str
    retention_ms: int
    created_ms: int


class CreateReply(NamedTuple):
    created: bool
    queue: str
    job: JobReply


class AckReply(NamedTuple):
    acked: int
    job: JobReply


class SettleReply(NamedTuple):
    claimed: list[tuple[str, float]]  #: tokens claimed and their scores
    due: list[str]  #: jobs whose retries are due (taken: promote them)
    wait_ms: int  #: until the next retry is due; -1 when none waits
    paused: bool = False  #: the queue is paused: nothing was claimed


class PromoteReply(NamedTuple):
    moved: int  #: retries put back into the stream
    wait_ms: int  #: ms until the next waiting retry is due (0 when due already), or -1
    concurrency: int  #: the job's tokens (0 when its meta is gone)


class Call(NamedTuple):
    """One script invocation, for :meth:`Scripts.run_many`."""

    name: str
    keys: Sequence[str]
    args: Sequence[Any]
