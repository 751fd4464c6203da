"""streamq: a job queue on Redis Streams that loses nothing and counts once."""

from __future__ import annotations

from streamq.base.models import Completion, JobState, JobStatus, Task
from streamq.producer.client import Job, Queue, StreamingJob
from streamq.producer.tasks import Tasks
from streamq.reaping.reaper import Reaper
from streamq.work.worker import Worker, current_task
from streamq.work.worker_options import WorkerOptions

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

__version__ = "0.1.0"

__all__ = [
    "Completion", "ConfigError", "ConnectionFailed", "DeadLetterReplayed", "Job", "JobClosed", "JobConflict",
    "JobNotFound", "JobState", "JobStatus", "NonRetryable", "PayloadError", "RetryLater", "PayloadTooLarge", "Queue",
    "Reaper", "RowConflict", "StreamingJob", "StreamqError", "Task", "Tasks", "TotalMismatch", "WaitTimeout", "Worker",
    "WorkerOptions", "WriteConflict", "current_task",
]
