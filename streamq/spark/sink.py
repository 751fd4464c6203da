"""The streaming sink: ``df.writeStream.format("streamq")``, a job per micro-batch.

Each micro-batch becomes one job whose id comes from the query and the batch:
``<job option>-<batch id>`` when the ``job`` option is given, else
``<query id>-<batch id>``. The query id is the one kept in the checkpoint, so a
query restarted from its checkpoint re-runs an unfinished batch into the same
job, under the same write token ``stream:<query id>:<batch id>``:

* the tasks (executors) read the query and batch ids from Spark's local
  properties, open the batch's job with that token (the first task creates it,
  the others join it; a job of another query or write is refused), and add
  their rows with ids that do not depend on order (:mod:`streamq.spark.rowids`),
  so rows a killed run added are skipped when the batch runs again;
* ``commit`` (driver) finalizes the job if it holds exactly the rows the
  tasks produced; a batch whose job was committed before (the query died
  after the sink's commit, before Spark recorded it) is found committed by its
  token and adds nothing: no batch is submitted twice;
* ``abort`` leaves the batch's job open: the query restarted from its
  checkpoint runs the batch again into it and commits it (to drop the work of
  a query that is abandoned instead, abort the job: ``streamq.spark.abort_job``).

A micro-batch without rows makes no job. The batch jobs show in
``streamq status`` like any job; the job's client is the ``client`` option.

With ``option("jobPerBatch", "false")`` every micro-batch adds to one
long-running job named by the ``job`` option, under the token
``stream:<query id>``, each sub-request id prefixed by ``<batch id>/``. The job
stays open: each batch's commit (``commit_batch``) records the batch and the
total it reached, after checking the job holds exactly what the committed
batches produced; a batch committed before adds nothing when it runs again.
Workers process the job's sub-requests as they come; finalize it when the
query is retired (``streamq.spark.finalize_job``) and it completes once the
last one is done.
A restart must come within the jobs' retention (their records say which
batches were committed).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from streamq.base.models import JobState
from streamq.producer.client import Queue

from ..errors import ConfigError, JobClosed
from .options import SourceOptions
from .writer import AddedPartition, WriteTarget, commit_write, open_write, write_partition

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

#: Spark's local properties that name the running query and micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass
class BatchPartition(WriterCommitMessage):
    """What one task of a micro-batch wrote (``job`` "" when its partition was empty)."""

    job: str
    token: str
    added: AddedPartition | None
    committed_before: bool = False


def batch_job(opts: SourceOptions, query_id: str, batch_id: int) -> tuple[str, str]:
    """(job id, write token) of a micro-batch."""
    if not opts.job_per_batch:
        return opts.job, f"stream:{query_id}"
    prefix = opts.job or query_id
    return f"{prefix}-{batch_id}", f"stream:{query_id}:{batch_id}"


def _peek(batches: Iterator[pa.RecordBatch]) -> tuple[bool, Iterator[pa.RecordBatch]]:
    """Whether any batch holds rows, and the batches from the first non-empty one."""
    for b in batches:
        if b.num_rows:
            def rest(first: pa.RecordBatch = b) -> Iterator[pa.RecordBatch]:
                yield first
                yield from batches
            return True, rest()
    return False, iter(())


class StreamqStreamWriter(DataSourceStreamArrowWriter):
    """One streaming query's sink: created on the driver, pickled to the tasks."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> BatchPartition:
        ctx = TaskContext.get()
        query = ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx else None
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx else None
        if ctx is None or not query or batch is None:
            raise ConfigError("the streamq sink runs inside a streaming query's tasks only")
        job, token = batch_job(self.opts, query, int(batch))
        has_rows, batches = _peek(iterator)
        if not has_rows:
            return BatchPartition("", token, None)
        target = open_write(self.opts, job, token)
        if self._committed(job, int(batch)):
            return BatchPartition(job, token, None, committed_before=True)
        if not self.opts.job_per_batch:
            target = replace(target, id_prefix=f"{batch}/")
        added = write_partition(target, batches, ctx.partitionId(), ctx.attemptNumber())
        return BatchPartition(job, token, added)

    def _committed(self, job: str, batch: int) -> bool:
        """Whether the batch was committed before; a job aborted meanwhile (by an
        operator) fails the batch: its rows cannot be written exactly once any more."""
        with Queue(self.opts.queue, self.opts.redis_url) as q:
            state = q.status(job).state
            last: Any = q.redis.hget(q.keys.job(job).meta, "stream_batch")
        if not self.opts.job_per_batch:
            if last is not None and int(last) >= batch:
                return True
            if state is not JobState.OPEN:
                raise JobClosed(f"job {job!r} of this query is {state.value}: micro-batches "
                                "add to it only while it is open")
            return False
        if state is JobState.ABORTED:
            raise JobClosed(f"job {job!r} of this micro-batch was aborted: its rows cannot "
                            "be written (start the query with a new checkpoint)")
        return state is not JobState.OPEN

    def _target(self, messages: Sequence[WriterCommitMessage | None]) -> WriteTarget | None:
        for m in messages:
            if isinstance(m, BatchPartition) and m.job:
                return WriteTarget(self.opts, m.job, m.token, self.opts.concurrency, 0)
        return None

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        target = self._target(messages)
        if target is None:
            return  # no rows in this micro-batch: no job
        added = [m.added for m in messages
                 if isinstance(m, BatchPartition) and m.added is not None]
        if self.opts.job_per_batch:
            commit_write(target, added)
            return
        with Queue(self.opts.queue, self.opts.redis_url) as q:
            q.scripts.commit_batch(q.keys.job(target.job), target.token, batchId,
                                   sum(a.sub_requests for a in added))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Leave the batch's job open for the restarted query (see the module docstring)."""
