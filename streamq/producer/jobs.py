"""Handles on submitted jobs: :class:`Job` and the open :class:`StreamingJob`."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis

from streamq.base import config
from streamq.base.keys import QueueKeys
from streamq.base.models import JobStatus
from streamq.errors import ConfigError, ConnectionFailed, JobClosed
from streamq.model.scripts import new_token
from streamq.services.tracing import traced_submit
from streamq.storage.connection import CONNECTION_ERRORS, is_transient
from streamq.storage.redis_errors import reply_text

if TYPE_CHECKING:
    from streamq.model.queue_view import QueueJobs as Queue

F = TypeVar("F", bound=Callable[..., Any])


def wrap_connection_errors(fn: F) -> F:
    """Redis out of reach, refusing the credentials, or refusing work for longer than a
    queue client waits (:data:`config.PRODUCER_OUTLAST_S`): ConnectionFailed."""
    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except redis.AuthenticationError as e:
            raise ConnectionFailed(f"Redis refused the credentials: {e}") from None
        except CONNECTION_ERRORS as e:
            raise ConnectionFailed(f"cannot reach Redis: {e}") from None
        except redis.ResponseError as e:
            if is_transient(e):
                failed = ConnectionFailed(f"Redis cannot serve for now: {reply_text(e)}")
                failed.transient = True  # (still one to wait out: is_transient says so)
                raise failed from None
            raise

    return cast(F, inner)


def outlasting(fn: F) -> F:
    """A read made again, with backoff for up to :data:`config.PRODUCER_OUTLAST_S`,
    while Redis refuses it for a while (BUSY, LOADING...): reading again changes
    nothing. (A call that writes is sent again by the scripts, which know what ran.)"""
    @functools.wraps(fn)
    def inner(*args: Any, **kwargs: Any) -> Any:
        deadline, pause = time.monotonic() + config.PRODUCER_OUTLAST_S, 0.05
        while True:
            try:
                return fn(*args, **kwargs)
            except redis.ResponseError as e:
                if not is_transient(e) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    return cast(F, inner)



class Job:
    """A handle on a submitted job."""

    def __init__(self, queue: Queue, job_id: str, created: bool = True) -> None:
        self.queue = queue
        self.id = job_id
        #: False when the submit found the job (or its dedup key) already there.
        self.created = created

    def status(self) -> JobStatus:
        return self.queue.status(self.id)

    def results(self) -> dict[int, Any]:
        return self.queue.results(self.id)

    def wait(self, timeout: float | None = None) -> JobStatus:
        return self.queue.wait(self.id, timeout)

    def __repr__(self) -> str:
        return f"Job({self.queue.name!r}, {self.id!r})"


class StreamingJob(Job):
    """An open job: add sub-requests, then finalize. As a context manager it
    finalizes when the block ends without an exception; after an exception
    it stays open, so nothing incomplete can be reported as complete."""

    def __init__(self, queue: Queue, job_id: str, created: bool, concurrency: int,
                 shard: QueueKeys | None = None, closed: bool = False) -> None:
        super().__init__(queue, job_id, created)
        self.concurrency = concurrency
        #: the queue shard the job lives on
        self.shard = shard if shard is not None else queue.keys
        #: a job that is never open (a small job): adds raise JobClosed, a finalize
        #: changes nothing, as for a job finalized before
        self.closed = closed

    def add(self, payload: Any) -> int:
        """Add one sub-request; return its index."""
        return self.add_many([payload])[0]

    @traced_submit("add", job=True)
    @wrap_connection_errors
    def add_many(self, payloads: Iterable[Any], *, batch_id: str | None = None) -> list[int]:
        """Add sub-requests (validated first: a bad one adds nothing); return their indexes.

        Each call is one write, sent again after a lost reply and applied once.
        Give ``batch_id`` (unique per batch, at most 64 characters) to retry a call
        that raised ConnectionFailed: the sub-requests it added are not added again
        and their indexes are returned (for the job's retention after its last add).
        """
        return self.add_many_encoded(self.queue._encode_all(payloads), batch_id=batch_id)

    def add_many_encoded(self, entries: Sequence[tuple[bytes, bytes]], *,
                         batch_id: str | None = None) -> list[int]:
        """Add sub-requests already encoded by :func:`streamq.codec.encode`."""
        if batch_id is not None and (not isinstance(batch_id, str) or not 0 < len(batch_id) <= 64):
            raise ConfigError("batch_id must be a string of 1 to 64 characters")
        if self.closed:
            raise JobClosed(f"job {self.id!r} is finalized: no sub-request can be added")
        jk, out = self.shard.job(self.id), list[int]()
        base = batch_id or new_token()
        for start in range(0, len(entries), config.ADD_CHUNK):
            chunk = entries[start : start + config.ADD_CHUNK]
            end = self.queue.scripts.add_tasks(jk, chunk, batch_id=f"{base}:{start}")
            out.extend(range(end - len(chunk), end))
            self.queue.scripts.unpark(self.shard, self.id, self.concurrency)
        return out

    @wrap_connection_errors
    def finalize(self) -> None:
        """Declare that no more sub-requests come; the job may complete at once."""
        if self.closed:
            return
        reply = self.queue.scripts.finalize_job(self.shard.job(self.id))
        if reply.completed:
            self.queue._finish(self.id, reply, self.shard)

    def __enter__(self) -> StreamingJob:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.finalize()
