"""Reading a job's results into Spark, in batch and as a stream.

A job's settled sub-requests become rows of :data:`RESULT_SCHEMA`:

* ``id``: the deterministic id the Spark writer gave the sub-request
  (``<partition>:<position>``); null for sub-requests added another way;
* ``index``: the index streamq assigned at add;
* ``status``: ``done`` (a result is stored) or ``failed`` (dead-lettered);
* ``result``: the handler's return value as JSON text (a str result becomes a
  JSON string, a bytes result a JSON string of its base64); null when failed;
* ``error``: the error of a failed one (from its JSON error record), else null.

Batch: the index range ``[0, total)`` is split into partitions of
``indexesPerSplit`` indexes, each read with pipelined HMGET of ``results``,
``errors`` and ``ids`` and returned as Arrow record batches. Sub-requests not
settled yet are left out, so read a job after waiting for it.

Stream: the offset is ``{"settled": k}``, the length of the job's settled
prefix: every index below ``k`` has a result or an error. Results are stored
in whatever order workers finish, so a count of done + failed would not say
*which* indexes are new; the prefix does, and it replays exactly the same rows
for the same offsets after a restart from a checkpoint. Workers take entries
in stream order, so the prefix advances steadily; a slow or retried
sub-request holds back the ones after it until it settles. Once the job is
terminal the latest offset is its total.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs, no py.typed
import redis
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from ..connection import connect
from ..errors import JobConflict, JobNotFound
from ..keys import JobKeys
from ..scripts import Scripts
from .source import SourceOptions

#: The schema of a read: one row per settled sub-request.
RESULT_SCHEMA = "id string, index bigint, status string, result string, error string"
_ARROW_SCHEMA = pa.schema([("id", pa.string()), ("index", pa.int64()), ("status", pa.string()),
                           ("result", pa.string()), ("error", pa.string())])
#: Indexes read per round trip (and per Arrow record batch).
READ_CHUNK = 2000
#: Indexes a stream reader looks past its start at most when it computes the latest offset.
MAX_SCAN = 200_000


class IndexRange(InputPartition):
    """Sub-request indexes ``[lo, hi)`` of one job."""

    def __init__(self, lo: int, hi: int) -> None:
        super().__init__((lo, hi))
        self.lo, self.hi = lo, hi


def result_json(raw: bytes) -> str:
    """A stored result (type letter + bytes) as JSON text."""
    kind, data = raw[:1], raw[1:]
    if kind == b"j":
        return data.decode()
    if kind == b"s":
        return json.dumps(data.decode("utf-8", "surrogatepass"))
    return json.dumps(base64.b64encode(data).decode())


def _error_text(raw: bytes) -> str:
    try:
        record = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
    return str(record.get("error")) if isinstance(record, dict) else str(record)


def read_range(client: redis.Redis, jk: JobKeys, lo: int, hi: int) -> pa.RecordBatch:
    """The settled sub-requests with indexes in ``[lo, hi)`` as one Arrow record batch."""
    indexes = list(range(lo, hi))
    pipe = client.pipeline(transaction=False)
    pipe.hmget(jk.results, indexes)
    pipe.hmget(jk.errors, indexes)
    pipe.hmget(jk.ids, indexes)
    results, errors, ids = pipe.execute()
    col_id: list[str | None] = []
    col_index: list[int] = []
    col_status: list[str] = []
    col_result: list[str | None] = []
    col_error: list[str | None] = []
    for i, res, err, sub_id in zip(indexes, results, errors, ids):
        if res is None and err is None:
            continue
        col_id.append(sub_id.decode() if sub_id is not None else None)
        col_index.append(i)
        if res is not None:
            col_status.append("done")
            col_result.append(result_json(res))
            col_error.append(None)
        else:
            col_status.append("failed")
            col_result.append(None)
            col_error.append(_error_text(err))
    return pa.RecordBatch.from_arrays(
        [pa.array(col_id, pa.string()), pa.array(col_index, pa.int64()),
         pa.array(col_status, pa.string()), pa.array(col_result, pa.string()),
         pa.array(col_error, pa.string())], schema=_ARROW_SCHEMA)


def _read(opts: SourceOptions, part: InputPartition) -> Iterator[pa.RecordBatch]:
    assert isinstance(part, IndexRange)
    client, jk = connect(opts.redis_url), JobKeys(opts.job)
    try:
        for lo in range(part.lo, part.hi, READ_CHUNK):
            batch = read_range(client, jk, lo, min(part.hi, lo + READ_CHUNK))
            if batch.num_rows:
                yield batch
    finally:
        client.close()


def _meta(client: redis.Redis, opts: SourceOptions) -> tuple[str, int]:
    """(state, total) of the job; JobNotFound / JobConflict when it is not the queue's."""
    m: Any = client.hmget(JobKeys(opts.job).meta, "state", "total", "queue")
    if m[0] is None:
        raise JobNotFound(opts.job)
    if m[2] is not None and m[2].decode() != opts.queue:
        raise JobConflict(f"job {opts.job!r} belongs to queue {m[2].decode()!r}, "
                          f"not {opts.queue!r}")
    return m[0].decode(), int(m[1] or 0)


def _splits(lo: int, hi: int, size: int) -> list[IndexRange]:
    return [IndexRange(a, min(hi, a + size)) for a in range(lo, hi, size)]


class StreamqReader(DataSourceReader):
    """Batch read of one job's settled sub-requests, split by index range."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        client = connect(self.opts.redis_url)
        try:
            state, total = _meta(client, self.opts)
            if state not in ("open", "active"):
                Scripts(client).expire_keyed(JobKeys(self.opts.job))
        finally:
            client.close()
        return _splits(0, total, self.opts.indexes_per_split) or [IndexRange(0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)


class StreamqStreamReader(DataSourceStreamReader):
    """Incremental read of a job's results: offsets are its settled prefix (see above)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._known = 0  # a settled prefix already seen (the prefix only grows)
        self._client: redis.Redis | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None  # a connection is not sent to the executors
        return state

    def _redis(self) -> redis.Redis:
        if self._client is None:
            self._client = connect(self.opts.redis_url)
        return self._client

    def initialOffset(self) -> dict[str, int]:
        _meta(self._redis(), self.opts)  # an unknown job fails the query at its start
        return {"settled": 0}

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: Any = None) -> dict[str, int]:
        base = max(int(start["settled"]) if start else 0, self._known)
        client, jk = self._redis(), JobKeys(self.opts.job)
        state, total = _meta(client, self.opts)
        if state not in ("open", "active"):
            end = total
        else:
            end = self._settled_prefix(client, jk, base, min(total, base + MAX_SCAN))
        max_rows = getattr(limit, "max_rows", None)
        if isinstance(max_rows, int) and start:
            end = min(end, int(start["settled"]) + max_rows)
        self._known = max(self._known, end)
        return {"settled": end}

    @staticmethod
    def _settled_prefix(client: redis.Redis, jk: JobKeys, lo: int, hi: int) -> int:
        for a in range(lo, hi, READ_CHUNK):
            indexes = range(a, min(hi, a + READ_CHUNK))
            pipe = client.pipeline(transaction=False)
            for i in indexes:
                pipe.hexists(jk.results, str(i))
                pipe.hexists(jk.errors, str(i))
            flags = pipe.execute()
            for n, i in enumerate(indexes):
                if not (flags[2 * n] or flags[2 * n + 1]):
                    return i
        return hi

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return _splits(int(start["settled"]), int(end["settled"]), self.opts.indexes_per_split)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
