"""Writing a DataFrame into one streamq job, from the executors.

The write maps onto the streaming protocol (``Queue.open`` / add / finalize):

* ``writer()`` (driver): opens the job (its counter starts at 1, so it cannot
  complete while tasks add). An existing job id that is still open is
  resumed; any other existing job is refused.
* ``write()`` (one Spark task per partition, on the executors): turns rows,
  or chunks of ``rowsPerRequest`` rows, into JSON sub-requests with the
  deterministic id ``<partition>:<position in the partition>`` and adds them
  with the fenced ``add_keyed`` script, ``pipelineDepth`` calls of 500 per
  round trip. An id added before is skipped, so a retried or speculative
  task adds nothing twice; nothing is added once the job is no longer open.
  Ids are deterministic when the partition's rows come in the same order on
  every attempt (true for files and for sorted input, not for every shuffle).
* ``commit()`` (driver, every task succeeded): checks that the job holds
  exactly the sub-requests the successful tasks wrote, then finalizes it.
* ``abort()`` (driver, the write failed): aborts the job (``abort_job``):
  closed for adds, undelivered work dropped, state ``aborted``, and its one
  completion recorded through :meth:`streamq.Queue.finish_call`.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from .. import config
from ..client import Queue, StreamingJob
from ..connection import connect
from ..errors import JobConflict, PayloadError, PayloadTooLarge, StreamqError
from ..keys import JobKeys, QueueKeys
from ..models import JobState
from ..scripts import Call, Scripts
from .source import SourceOptions

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

#: How long the id maps of a job outlive its last add, beyond the job's retention, in ms.
KEEP_AFTER_ADD_MS = 7 * 24 * 3600 * 1000


@dataclass
class AddedPartition(WriterCommitMessage):
    """What one successful task wrote."""

    partition: int
    attempt: int
    rows: int
    sub_requests: int  #: ids this task produced
    added: int  #: of them, added by this attempt
    skipped: int  #: of them, found added before (by an earlier attempt)


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode_payload(sub_id: str, value: Any, max_bytes: int) -> bytes:
    """A row (dict) or chunk (list of dicts) as JSON: dates ISO 8601, decimals as strings,
    binary as base64. Raises PayloadError naming the sub-request."""
    try:
        data = json.dumps(value, separators=(",", ":"), allow_nan=False,
                          default=_json_default).encode()
    except (TypeError, ValueError) as e:
        raise PayloadError(f"sub-request {sub_id}: row is not JSON serialisable: {e}") from None
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"sub-request {sub_id} is {len(data)} bytes, over the limit of "
                              f"{max_bytes} bytes (lower rowsPerRequest)")
    return data


class _Adder:
    """Buffers sub-requests into add_keyed calls and sends them, pipelined."""

    def __init__(self, opts: SourceOptions, concurrency: int, keep_ms: int) -> None:
        self.opts, self.concurrency, self.keep_ms = opts, concurrency, keep_ms
        self.client = connect(opts.redis_url)
        self.scripts = Scripts(self.client)
        self.jk, self.qk = JobKeys(opts.job), QueueKeys(opts.queue)
        self.entries: list[tuple[str, bytes, bytes]] = []
        self.calls: list[Call] = []
        self.added = self.skipped = 0

    def add(self, sub_id: str, data: bytes) -> None:
        self.entries.append((sub_id, b"j", data))
        if len(self.entries) >= config.ADD_CHUNK:
            self.calls.append(self.scripts.add_keyed_call(self.jk, self.keep_ms, self.entries))
            self.entries = []
            if len(self.calls) >= self.opts.pipeline_depth:
                self.flush()

    def flush(self) -> None:
        if self.entries:
            self.calls.append(self.scripts.add_keyed_call(self.jk, self.keep_ms, self.entries))
            self.entries = []
        if not self.calls:
            return
        replies, self.calls = self.scripts.run_many(self.calls), []
        for reply in replies:
            a, s, _total = Scripts.parse_add_keyed(reply, self.opts.job)
            self.added += a
            self.skipped += s
        # wake the job's parked tokens: it got work. Also when every id was skipped: a
        # batch resent after a lost reply reports its own adds as skipped
        self.scripts.unpark(self.qk, self.opts.job, self.concurrency)

    def close(self) -> None:
        self.client.close()


class StreamqWriter(DataSourceArrowWriter):
    """One ``df.write.format("streamq")``: created on the driver, pickled to the tasks."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        q = Queue(opts.queue, opts.redis_url)
        try:
            job = q.open(job_id=opts.job, priority=opts.priority, concurrency=opts.concurrency,
                         client=opts.client, max_deliveries=opts.max_deliveries)
            state = q.status(opts.job).state
            if state is not JobState.OPEN:
                raise JobConflict(f"job {opts.job!r} exists already and is {state.value}: write "
                                  "into a new job id (or an open one, to resume its write)")
            retention: Any = q.redis.hget(JobKeys(opts.job).meta, "retention")
        finally:
            q.close()
        self.concurrency = job.concurrency
        self.keep_ms = int(retention or q.retention_ms) + KEEP_AFTER_ADD_MS

    def write(self, iterator: Iterator[pa.RecordBatch]) -> AddedPartition:
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        n, max_bytes = self.opts.rows_per_request, config.DEFAULT_MAX_PAYLOAD_BYTES
        adder = _Adder(self.opts, self.concurrency, self.keep_ms)
        rows = position = 0
        chunk: list[dict[str, Any]] = []
        try:
            for batch in iterator:
                for row in batch.to_pylist():
                    rows += 1
                    if n == 1:
                        sub_id = f"{partition}:{position}"
                        adder.add(sub_id, encode_payload(sub_id, row, max_bytes))
                        position += 1
                        continue
                    chunk.append(row)
                    if len(chunk) == n:
                        sub_id = f"{partition}:{position}"
                        adder.add(sub_id, encode_payload(sub_id, chunk, max_bytes))
                        position, chunk = position + 1, []
            if chunk:
                sub_id = f"{partition}:{position}"
                adder.add(sub_id, encode_payload(sub_id, chunk, max_bytes))
                position += 1
            adder.flush()
        finally:
            adder.close()
        return AddedPartition(partition, attempt, rows, position, adder.added, adder.skipped)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        written = sum(m.sub_requests for m in messages if isinstance(m, AddedPartition))
        q = Queue(self.opts.queue, self.opts.redis_url)
        try:
            total = q.status(self.opts.job).total
            if total != written:
                reason = (f"the job holds {total} sub-requests but the successful tasks wrote "
                          f"{written}: the input is not deterministic (a retried task produced "
                          "other rows); job aborted")
                _abort(q, self.opts.job, reason)
                raise StreamqError(f"job {self.opts.job!r}: {reason}")
            StreamingJob(q, self.opts.job, created=False, concurrency=self.concurrency).finalize()
        finally:
            q.close()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_job(self.opts.queue, self.opts.job, self.opts.redis_url,
                  "the Spark write failed")


def _abort(q: Queue, job_id: str, reason: str) -> bool:
    reply = q.scripts.abort_job(JobKeys(job_id), reason)
    if reply.completed:
        call = q.finish_call(job_id, reply)
        q.scripts.run(call.name, call.keys, call.args)
    return reply.completed


def abort_job(queue: str, job_id: str, redis_url: str, reason: str = "aborted") -> bool:
    """Abort an open or active job: no add passes afterwards, undelivered work is dropped,
    and the job gets its one completion (state ``aborted``). Return True if this call
    aborted it, False if it was terminal already; JobNotFound for an unknown job."""
    q = Queue(queue, redis_url)
    try:
        return _abort(q, job_id, reason)
    finally:
        q.close()
