"""Reading a job's results into Spark, in batch and as a stream.

A job's settled sub-requests become rows of :data:`RESULT_SCHEMA`:

* ``id``: the id the Spark writer gave the sub-request (see
  :mod:`streamq.spark.rowids`); null for sub-requests added another way;
* ``index``: the index streamq assigned at add;
* ``status``: ``done`` (a result is stored) or ``failed`` (dead-lettered);
* ``result``: the handler's return value as JSON text (a str result becomes a
  JSON string, a bytes result a JSON string of its base64); null when failed;
* ``error``: the error of a failed one (the summary line of its JSON error record;
  its traceback is in its dead letter), else null.

Batch: the index range ``[0, total)`` is split into partitions of
``indexesPerSplit`` indexes, each read READ_CHUNK indexes per round trip with
one HMGET of ``results``, ``errors`` and ``ids`` each (``errors`` only when
that hash existed when the partition started: without it no index of the
range had failed by then) and returned as Arrow record batches built from the
replies in Arrow (JSON results are cut in Arrow; other result types and error
records are converted row by row). Sub-requests not settled yet are left out,
so read a job after waiting for it.

A small job (:mod:`streamq.producer.lane`: one sub-request, no hashes of its own) reads
the same: the driver finds it (no meta) and its partitions say so; its one row (index
0) comes from its shard's lane records (its result, else its error record).

Stream: the offset is ``{"settled": k}``, the length of the job's settled
prefix: every index below ``k`` has a result or an error. Results are stored
in whatever order workers finish, so a count of done + failed would not say
*which* indexes are new; the prefix does, and it replays exactly the same rows
for the same offsets after a restart from a checkpoint. Workers take entries
in stream order, so the prefix advances steadily; a slow or retried
sub-request holds back the ones after it until it settles. Once the job is
terminal the latest offset is its total. The prefix is scanned READ_CHUNK
indexes per round trip: an HMGET of ``errors`` and an HEXISTS of ``results``
per index (results are not sent back).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs, no py.typed
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from streamq.base.failures import split_failure
from streamq.base.keys import JobKeys, QueueKeys, shard_queue
from streamq.model.scripts import Scripts
from streamq.producer import lane
from streamq.services.shards import read_shards
from streamq.storage.connection import Client, connect, pipelined

from ..errors import JobConflict, JobNotFound
from .options import SourceOptions

#: The schema of a read: one row per settled sub-request.
RESULT_SCHEMA = "id string, index bigint, status string, result string, error string"
_ARROW_SCHEMA = pa.schema([("id", pa.string()), ("index", pa.int64()), ("status", pa.string()),
                           ("result", pa.string()), ("error", pa.string())])
#: Indexes read per round trip (and per Arrow record batch).
READ_CHUNK = 2000
_JSON_KIND = pa.scalar(b"j", pa.binary())
_DONE, _FAILED = pa.scalar("done", pa.string()), pa.scalar("failed", pa.string())
#: Indexes a stream reader looks past its start at most when it computes the latest offset.
MAX_SCAN = 200_000


class IndexRange(InputPartition):
    """Sub-request indexes ``[lo, hi)`` of one job; ``small``: a small job's (no stream
    of its own: its one sub-request is read from its shard's lane records)."""

    def __init__(self, lo: int, hi: int, small: bool = False) -> None:
        super().__init__((lo, hi, small))
        self.lo, self.hi, self.small = lo, hi, small


def result_json(raw: bytes) -> str:
    """A stored result (type letter + bytes) as JSON text."""
    kind, data = raw[:1], raw[1:]
    if kind == b"j":
        return data.decode()
    if kind == b"s":
        return json.dumps(data.decode("utf-8", "surrogatepass"))
    return json.dumps(base64.b64encode(data).decode())


def _error_text(raw: bytes) -> str:
    """The error's summary line (``Type: message``); its traceback stays in the job's
    record and its dead letter (``streamq dlq show``)."""
    try:
        record = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
    text = str(record.get("error")) if isinstance(record, dict) else str(record)
    return split_failure(text)[0]


def _hmgets(client: Client, keys: Sequence[str], indexes: range) -> list[list[Any]]:
    """HMGET of ``indexes`` in each hash of ``keys``, one round trip."""
    replies = pipelined(client, [("HMGET", key, *indexes) for key in keys])
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _result_column(results: pa.Array, raw: list[bytes | None]) -> pa.Array:
    """The ``result`` column: JSON results (type letter ``j``, nearly always all of them)
    are cut in Arrow; any other type goes through :func:`result_json` row by row."""
    if pc.all(pc.equal(pc.binary_slice(results, 0, 1), _JSON_KIND)).as_py() is not False:
        # a stop past every value (pyarrow overflows on an unbounded one)
        return pc.binary_slice(results, 1, results.nbytes + 1).cast(pa.string())
    return pa.array([None if r is None else result_json(r) for r in raw], pa.string())


def read_range(client: Client, jk: JobKeys, lo: int, hi: int, *,
               errors: bool = True) -> pa.RecordBatch:
    """The settled sub-requests with indexes in ``[lo, hi)`` as one Arrow record batch.
    ``errors=False`` skips the ``errors`` hash (the caller saw it does not exist)."""
    indexes = range(lo, hi)
    if not indexes:
        return pa.RecordBatch.from_pylist([], schema=_ARROW_SCHEMA)
    keys = [jk.results, jk.ids, jk.errors] if errors else [jk.results, jk.ids]
    replies = _hmgets(client, keys, indexes)
    results = pa.array(replies[0], pa.binary())
    done = pc.is_valid(results)
    if errors and any(e is not None for e in replies[2]):
        col_error = pa.array([_error_text(e) if e is not None and r is None else None
                              for r, e in zip(replies[0], replies[2])], pa.string())
        settled = pc.or_(done, pc.is_valid(col_error))
    else:
        col_error, settled = pa.nulls(len(indexes), pa.string()), done
    batch = pa.RecordBatch.from_arrays(
        [pa.array(replies[1], pa.string()), pa.array(indexes, pa.int64()),
         pc.if_else(done, _DONE, _FAILED), _result_column(results, replies[0]), col_error],
        schema=_ARROW_SCHEMA)
    return batch if results.null_count == 0 else batch.filter(settled)


def _small(client: Client, opts: SourceOptions
           ) -> tuple[dict[str, Any], bytes | None, bytes | None] | None:
    """The small job ``opts.job`` of ``opts.queue`` (one sub-request, no stream of its own:
    :mod:`streamq.producer.lane`): its record, encoded result and error record; None
    when no such job is kept."""
    shards = read_shards(client, opts.queue) or [QueueKeys(opts.queue)]
    got = lane.settled(client, lane.shard_of_job(shards, opts.job), opts.job)
    if got is None or shard_queue(str(got[0]["queue"])) != opts.queue:
        return None
    return got


def _small_rows(client: Client, opts: SourceOptions, part: IndexRange
                ) -> Iterator[pa.RecordBatch]:
    """A small job's one sub-request (index 0) as the job lane reads one: its row once it
    settled (a result, else a dead letter's error) and the range holds index 0."""
    got = _small(client, opts) if part.lo <= 0 < part.hi else None
    if got is None or (got[1] is None and got[2] is None):
        return
    _, result, error = got
    row = {"id": None, "index": 0, "status": "done" if result is not None else "failed",
           "result": None if result is None else result_json(result),
           "error": None if result is not None or error is None else _error_text(error)}
    yield pa.RecordBatch.from_pylist([row], schema=_ARROW_SCHEMA)


def _read(opts: SourceOptions, part: InputPartition) -> Iterator[pa.RecordBatch]:
    assert isinstance(part, IndexRange)
    client, jk = connect(opts.redis_url), JobKeys(opts.job, opts.queue)
    try:
        # a sub-request that failed before this point has its error in `errors`: without
        # that hash, skip its HMGET (one a chunk); a failure stored later is left out like
        # any sub-request settled after the read (a stream's range is settled before)
        if part.small:
            yield from _small_rows(client, opts, part)
            return
        errors = part.lo < part.hi and bool(client.exists(jk.errors))
        for lo in range(part.lo, part.hi, READ_CHUNK):
            batch = read_range(client, jk, lo, min(part.hi, lo + READ_CHUNK), errors=errors)
            if batch.num_rows:
                yield batch
    finally:
        client.close()


def _meta(client: Client, opts: SourceOptions) -> tuple[str, int, bool]:
    """(state, total, whether it is a small job) of the job; JobNotFound / JobConflict
    when it is not the queue's."""
    m: Any = client.hmget(JobKeys(opts.job, opts.queue).meta, "state", "total", "queue")
    if m[0] is None:
        small = _small(client, opts)
        if small is None:
            raise JobNotFound(opts.job)
        return str(small[0]["state"]), 1, True
    if m[2] is not None and shard_queue(m[2].decode()) != opts.queue:
        raise JobConflict(f"job {opts.job!r} belongs to queue "
                          f"{shard_queue(m[2].decode())!r}, not {opts.queue!r}")
    return m[0].decode(), int(m[1] or 0), False


def _splits(lo: int, hi: int, size: int, small: bool = False) -> list[IndexRange]:
    return [IndexRange(a, min(hi, a + size), small) for a in range(lo, hi, size)]


class StreamqReader(DataSourceReader):
    """Batch read of one job's settled sub-requests, split by index range."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        client = connect(self.opts.redis_url)
        try:
            state, total, small = _meta(client, self.opts)
            if state not in ("open", "active") and not small:
                Scripts(client).expire_keyed(JobKeys(self.opts.job, self.opts.queue))
        finally:
            client.close()
        return _splits(0, total, self.opts.indexes_per_split, small) or [IndexRange(0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)


class StreamqStreamReader(DataSourceStreamReader):
    """Incremental read of a job's results: offsets are its settled prefix (see above)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._known = 0  # a settled prefix already seen (the prefix only grows)
        self._client: Client | None = None
        self._small: bool | None = None  # whether the job is a small job, once read

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a connection is not sent to the executors
        return state

    def _redis(self) -> Client:
        if self._client is None:
            self._client = connect(self.opts.redis_url)
        return self._client

    def initialOffset(self) -> dict[str, int]:
        # an unknown job fails the query at its start
        self._small = _meta(self._redis(), self.opts)[2]
        return {"settled": 0}

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: Any = None) -> dict[str, int]:
        base = max(int(start["settled"]) if start else 0, self._known)
        client, jk = self._redis(), JobKeys(self.opts.job, self.opts.queue)
        state, total, small = _meta(client, self.opts)
        self._small = small
        if state not in ("open", "active"):
            end = total
        elif small:  # its one sub-request has not settled
            end = base
        else:
            end = self._settled_prefix(client, jk, base, min(total, base + MAX_SCAN))
        max_rows = getattr(limit, "max_rows", None)
        if isinstance(max_rows, int) and start:
            end = min(end, int(start["settled"]) + max_rows)
        self._known = max(self._known, end)
        return {"settled": end}

    @staticmethod
    def _settled_prefix(client: Client, jk: JobKeys, lo: int, hi: int) -> int:
        """The first index in ``[lo, hi)`` with neither a result nor an error, else ``hi``.
        One round trip per READ_CHUNK indexes: an HMGET of ``errors`` (small records,
        nearly always absent) and an HEXISTS of ``results`` per index (results can be
        large: they are not sent back)."""
        for a in range(lo, hi, READ_CHUNK):
            indexes = range(a, min(hi, a + READ_CHUNK))
            replies = pipelined(client, [("HMGET", jk.errors, *indexes),
                                         *(("HEXISTS", jk.results, i) for i in indexes)])
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            errors = replies[0]
            for n, i in enumerate(indexes):
                if not replies[n + 1] and errors[n] is None:
                    return i
        return hi

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if self._small is None:  # (a batch planned again after a restart)
            self._small = _meta(self._redis(), self.opts)[2]
        return _splits(int(start["settled"]), int(end["settled"]), self.opts.indexes_per_split,
                       self._small)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
