"""Writing a DataFrame into one streamq job, from the executors.

The write maps onto the streaming protocol (``Queue.open`` / add / finalize),
and it owns its job:

* ``writer()`` (driver): opens the job with a fresh write token as its
  incarnation (its counter starts at 1, so it cannot complete while tasks
  add). A job id that exists already, whatever its state, is refused at
  once (WriteConflict) and left unchanged: one job, one write.
* ``write()`` (one Spark task per partition, on the executors): turns rows,
  or chunks of ``rowsPerRequest`` rows, into JSON sub-requests whose ids do
  not depend on the order the rows arrive in (:mod:`streamq.spark.rowids`)
  and adds them with the fenced ``add_keyed`` script: calls of up to 500
  sub-requests (or CALL_BYTES of payload), ``pipelineDepth`` calls (or
  ROUND_BYTES) per round trip. Only the write token that opened the job passes;
  an id added before with the same digest by the same partition is skipped
  (a retried or speculative task adds nothing twice); an id added with
  another digest, or by another partition, fails the task (RowConflict):
  the write cannot prove that row is added once.
* ``commit()`` (driver, every task succeeded): finalizes the job in one script
  only if it holds exactly the sub-requests the successful tasks produced;
  an earlier attempt that added rows its retry did not produce makes the
  totals differ (TotalMismatch), and the write aborts its job instead.
* ``abort()`` (driver, the write failed): aborts the job only if this write
  opened it and has not committed it: closed for adds, undelivered work
  dropped, state ``aborted``, and its one completion recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from redis.cluster import RedisCluster

from streamq.base import config
from streamq.base.keys import QueueKeys
from streamq.base.replies import new_token
from streamq.model.scripts import Call, Scripts
from streamq.producer.client import Queue
from streamq.storage.connection import connect, undecided

from ..errors import TotalMismatch, WriteConflict
from .options import SourceOptions
from .rowids import Chunker, RowIds

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

#: How long the id maps of a job outlive its last add, beyond the job's retention, in ms.
KEEP_AFTER_ADD_MS = 7 * 24 * 3600 * 1000
#: Payload bytes after which an add_keyed call is cut (before ``ADD_CHUNK`` entries).
CALL_BYTES = 128 * 1024
#: Payload bytes after which a round of calls is sent (before ``pipelineDepth`` calls),
#: so that Redis adds large sub-requests while the task packs the next round.
ROUND_BYTES = 512 * 1024


@dataclass
class AddedPartition(WriterCommitMessage):
    """What one successful task wrote."""

    partition: int
    attempt: int
    rows: int
    sub_requests: int  #: ids this task produced
    added: int  #: of them, added by this attempt
    skipped: int  #: of them, found added before (by an earlier attempt)


class _Adder:
    """Buffers one task's sub-requests into add_keyed calls and sends them, pipelined."""

    def __init__(self, target: WriteTarget, partition: int, attempt: int) -> None:
        self.target, self.partition, self.attempt = target, partition, attempt
        self.client = connect(target.opts.redis_url, cluster=target.cluster)
        self.scripts = Scripts(self.client)
        self.qk = QueueKeys(target.opts.queue, target.shard)
        self.jk = self.qk.job(target.job)
        self.entries: list[tuple[str, str, bytes, bytes]] = []
        self.entry_bytes = 0  # payload bytes of self.entries
        self.calls: list[Call] = []
        self.call_bytes = 0  # payload bytes of self.calls
        self.pending: Callable[[], list[Any]] | None = None  # replies of the round in flight
        self.added = self.skipped = 0

    def add(self, sub_id: str, digest: str, data: bytes) -> None:
        self.add_entry((sub_id, digest, b"j", data))

    def add_entry(self, entry: tuple[str, str, bytes, bytes]) -> None:
        if self.target.id_prefix:
            entry = (self.target.id_prefix + entry[0], *entry[1:])
        self.entries.append(entry)
        self.entry_bytes += len(entry[3])
        if len(self.entries) >= config.ADD_CHUNK or self.entry_bytes >= CALL_BYTES:
            self._call()
            if (len(self.calls) >= self.target.opts.pipeline_depth
                    or self.call_bytes >= ROUND_BYTES):
                self.flush()

    def _call(self) -> None:
        t = self.target
        self.calls.append(self.scripts.add_keyed_call(self.jk, t.keep_ms, t.token, self.partition,
                                                      self.attempt, self.entries))
        self.call_bytes += self.entry_bytes
        self.entries, self.entry_bytes = [], 0

    def flush(self, last: bool = False) -> None:
        """Send the buffered calls, then read the replies of the calls sent before:
        Redis runs one round while the task encodes the next. Each round ends with
        ``unpark`` (the job got work; also when every id was skipped: a round resent
        after a lost reply reports its own adds as skipped)."""
        if self.entries:
            self._call()
        pending = self.pending
        self.pending = None
        if self.calls:
            t = self.target
            calls = [*self.calls, self.scripts.unpark_call(self.qk, t.job, t.concurrency)]
            self.calls, self.call_bytes = [], 0
            self.pending = self.scripts.send_many(calls)
        if pending is not None:
            self._count(pending())
        if last and self.pending is not None:
            pending, self.pending = self.pending, None
            self._count(pending())

    def _count(self, replies: list[Any]) -> None:
        for reply in replies[:-1]:  # the last is unpark's
            a, s, _total = Scripts.parse_add_keyed(reply, self.target.job)
            self.added += a
            self.skipped += s

    def close(self) -> None:
        self.client.close()


@dataclass(frozen=True)
class WriteTarget:
    """What a task needs to add to a write's job: the job, its token and lifetimes."""

    opts: SourceOptions
    job: str
    token: str
    concurrency: int
    keep_ms: int
    id_prefix: str = ""  #: before every sub-request id (a micro-batch's, in one long job)
    cluster: bool | None = None  #: Redis Cluster or not, as the driver found; None: ask
    shard: str = ""  #: the tag of the queue shard the job lives on ("": the first)


def write_partition(target: WriteTarget, batches: Iterator[pa.RecordBatch],
                    partition: int, attempt: int) -> AddedPartition:
    """Add one partition's rows to the target job (the task side of a write)."""
    opts = target.opts
    ids = RowIds(partition, opts.key_column, config.DEFAULT_MAX_PAYLOAD_BYTES)
    adder = _Adder(target, partition, attempt)
    rows = sub_requests = 0
    try:
        if opts.rows_per_request == 1:
            for batch in batches:
                for entry in ids.batch_entries(batch):
                    adder.add_entry(entry)
                rows += batch.num_rows
            sub_requests = rows
        else:
            chunker = Chunker(ids, opts.rows_per_request)
            for batch in batches:
                chunker.add_batch(batch)
                rows += batch.num_rows
            for sub_id, digest, payload in chunker.chunks():
                adder.add(sub_id, digest, payload)
                sub_requests += 1
        adder.flush(last=True)
    finally:
        adder.close()
    return AddedPartition(partition, attempt, rows, sub_requests, adder.added, adder.skipped)


def open_write(opts: SourceOptions, job: str, token: str) -> WriteTarget:
    """Open ``job`` for the write named by ``token``; WriteConflict when the job exists
    and another write (or another producer) opened it."""
    with Queue(opts.queue, opts.redis_url) as q:
        sj = q.open(job_id=job, priority=opts.priority, concurrency=opts.concurrency,
                    client=opts.client, max_deliveries=opts.max_deliveries, token=token,
                    timeout=opts.timeout_s)
        if not sj.created:
            state = q.status(job).state
            raise WriteConflict(
                f"job {job!r} exists already ({state.value}): a write opens a new job, and a "
                "second write into one job is refused, leaving the first unchanged (write "
                "into another job id)")
        retention: Any = q.redis.hget(q.keys.job(job).meta, "retention")
        keep_ms = int(retention or q.retention_ms) + KEEP_AFTER_ADD_MS
        cluster = None if undecided(q.redis) else isinstance(q.redis, RedisCluster)
    return WriteTarget(opts, job, token, sj.concurrency, keep_ms, cluster=cluster,
                       shard=sj.shard.tag)


def commit_write(target: WriteTarget, messages: Sequence[WriterCommitMessage | None]) -> None:
    """Finalize the write's job if it holds exactly what the successful tasks produced;
    otherwise abort it (only if this write still owns it open) and raise."""
    written = sum(m.sub_requests for m in messages if isinstance(m, AddedPartition))
    with Queue(target.opts.queue, target.opts.redis_url) as q:
        try:
            reply = q.scripts.commit_write(q.keys.job(target.job), target.token, written)
        except TotalMismatch as e:
            _abort(q, target.job, f"commit refused: {e}", write_token=target.token)
            raise
        if reply.completed:
            q._finish(target.job, reply, q.job_shard(target.job))


def abort_write(target: WriteTarget, reason: str) -> bool:
    """Abort the write's job if this write opened it and has not committed it."""
    with Queue(target.opts.queue, target.opts.redis_url) as q:
        return _abort(q, target.job, reason, write_token=target.token)


class StreamqWriter(DataSourceArrowWriter):
    """One ``df.write.format("streamq")``: created on the driver, pickled to the tasks."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.target = open_write(opts, opts.job, new_token())

    def write(self, iterator: Iterator[pa.RecordBatch]) -> AddedPartition:
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        return write_partition(self.target, iterator, partition, attempt)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_write(self.target, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_write(self.target, "the Spark write failed")


def _abort(q: Queue, job_id: str, reason: str, *, write_token: str = "") -> bool:
    reply = q.scripts.abort_job(q.keys.job(job_id), reason, write_token=write_token)
    if reply.completed:
        call = q.finish_call(job_id, reply, q.job_shard(job_id))
        q.scripts.run(call.name, call.keys, call.args)
    return reply.completed


def abort_job(queue: str, job_id: str, redis_url: str, reason: str = "aborted") -> bool:
    """Abort an open or active job: no add passes afterwards, undelivered work is dropped,
    and the job gets its one completion (state ``aborted``). Return True if this call
    aborted it, False if it was terminal already; JobNotFound for an unknown job."""
    with Queue(queue, redis_url) as q:
        return _abort(q, job_id, reason)


def finalize_job(queue: str, job_id: str, redis_url: str) -> None:
    """Finalize an open job (the one job of a streaming query in the sink's single-job
    mode, once the query is retired): it completes when its last sub-request is done."""
    with Queue(queue, redis_url) as q:
        reply = q.scripts.finalize_job(q.keys.job(job_id))
        if reply.completed:
            q._finish(job_id, reply)
