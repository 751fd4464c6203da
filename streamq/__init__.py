"""streamq: a job queue on Redis Streams that loses nothing and counts once."""

from __future__ import annotations

from .client import Job, Queue, StreamingJob
from .errors import (
    ConfigError,
    ConnectionFailed,
    DeadLetterReplayed,
    JobClosed,
    JobConflict,
    JobNotFound,
    NonRetryable,
    PayloadError,
    PayloadTooLarge,
    RetryLater,
    RowConflict,
    StreamqError,
    TotalMismatch,
    WaitTimeout,
    WriteConflict,
)
from .models import Completion, JobState, JobStatus, Task
from .worker import Worker, current_task
from .worker_options import WorkerOptions

__version__ = "0.1.0"

__all__ = [
    "Completion", "ConfigError", "ConnectionFailed", "DeadLetterReplayed", "Job", "JobClosed", "JobConflict",
    "JobNotFound", "JobState", "JobStatus", "NonRetryable", "PayloadError", "RetryLater", "PayloadTooLarge", "Queue",
    "RowConflict", "StreamingJob", "StreamqError", "Task", "TotalMismatch", "WaitTimeout", "Worker",
    "WorkerOptions", "WriteConflict", "current_task",
]
