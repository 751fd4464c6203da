"""The exceptions streamq raises: one hierarchy under :class:`StreamqError`."""

from __future__ import annotations


class StreamqError(Exception):
    """Base class of every error streamq raises on purpose."""


class ConfigError(StreamqError):
    """Raised when a setting or argument is out of range or malformed."""


class ConnectionFailed(StreamqError):
    """Raised when Redis cannot be reached or refuses the connection."""

    #: True when Redis refused work for a while (a transient reply: BUSY, OOM, LOADING...)
    #: for longer than the client waited: what a worker's or a reaper's loop waits out
    transient: bool = False


class PayloadError(StreamqError):
    """Raised when a payload is not bytes, str or a JSON-serialisable value."""


class PayloadTooLarge(PayloadError):
    """Raised when an encoded payload exceeds the configured size limit."""


class JobNotFound(StreamqError):
    """Raised when a job id names no job (never submitted, or expired)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id!r} not found")
        self.job_id = job_id


class JobConflict(StreamqError):
    """Raised when a job id already names a job of another queue."""


class WriteConflict(JobConflict):
    """Raised when a write meets a job that another write opened (or that existed
    before it): a job is written by the one write that opened it."""


class RowConflict(StreamqError):
    """Raised when a fenced add cannot prove a row is added exactly once: its id was
    added before with another digest (the row changed between task attempts) or by
    another partition (two rows with one id)."""


class TotalMismatch(StreamqError):
    """Raised when a write's commit finds its job holding another number of
    sub-requests than its successful tasks produced; the job is left unchanged."""

    def __init__(self, job_id: str, expected: int, found: int) -> None:
        super().__init__(f"job {job_id!r} holds {found} sub-requests but the write's "
                         f"successful tasks produced {expected}: an earlier attempt added rows "
                         "its retry did not produce (the input is not deterministic)")
        self.job_id, self.expected, self.found = job_id, expected, found


class JobClosed(StreamqError):
    """Raised when sub-requests are added to a job that is no longer open."""


class WaitTimeout(StreamqError):
    """Raised when :meth:`streamq.Queue.wait` gives up before completion."""


class HandlerError(StreamqError):
    """Raised when a handler reference (``module:function``) cannot be loaded."""


class ScriptError(StreamqError):
    """Raised when a Lua script returns one of streamq's negative error codes."""

    def __init__(self, script: str, code: int, message: str, job_id: str | None = None) -> None:
        where = f" (job {job_id})" if job_id else ""
        super().__init__(f"{script}: {message}{where}")
        self.script = script
        self.code = code
        self.job_id = job_id


class DeadLetterReplayed(StreamqError):
    """Raised when a dead letter (or a copy of it) was replayed already: each dead
    letter is replayed once."""

    def __init__(self, dead_id: str, target: str = "") -> None:
        what = (f"was replayed already into job {target}" if target
                else "is being replayed by another caller")
        super().__init__(f"dead letter {dead_id} {what}")
        self.dead_id = dead_id
        self.target = target


class ScriptLoadError(StreamqError):
    """Raised when a Lua script or one of its includes cannot be assembled."""


class RetryLater(StreamqError):
    """Raised by a handler to ask for another attempt after ``delay_s`` seconds."""

    def __init__(self, delay_s: float, reason: str = "") -> None:
        super().__init__(reason or f"retry requested in {delay_s} s")
        self.delay_s = delay_s


class NonRetryable(StreamqError):
    """Raised by a handler when another attempt cannot help: dead-letter at once."""


class ResultError(PayloadError, NonRetryable):
    """Raised in a worker when a handler's return value cannot be stored (not bytes, str
    or a JSON value): the sub-request is dead-lettered at once, since running the
    handler again would return the same kind of value."""


class HandlerTimeout(StreamqError):
    """Raised in a worker, and recorded as the failed attempt's error, when a handler
    ran past its job's timeout (``submit(..., timeout=S)``): the attempt counts as
    failed and is retried with backoff like any other failure."""

    def __init__(self, limit_s: float) -> None:
        super().__init__(f"handler ran past the job's timeout of {limit_s:g} s")
        self.limit_s = limit_s
