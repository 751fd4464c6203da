"""The Spark reader's Redis side against a real redis-server: what a range of indexes reads
back as, and how far a job's settled prefix reaches. No Spark session is started (the
reader's functions run as they do inside a task); test_spark.py reads through Spark."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import redis

from streamq.base.keys import JobKeys
from streamq.spark.reader import (
    READ_CHUNK,
    IndexRange,
    StreamqStreamReader,
    _read,
    read_range,
)
from streamq.spark.source import SourceOptions

pytestmark = pytest.mark.spark

Row = tuple[str | None, int, str, str | None, str | None]


def expected_row(i: int, result: bytes | None, error: bytes | None,
                 sub_id: bytes | None) -> Row | None:
    """What RESULT_SCHEMA says index ``i`` reads back as (None: left out, not settled)."""
    if result is None and error is None:
        return None
    rid = None if sub_id is None else sub_id.decode()
    if result is None:
        assert error is not None
        try:
            record = json.loads(error)
            text = str(record.get("error")) if isinstance(record, dict) else str(record)
        except ValueError:
            text = error.decode(errors="replace")
        return (rid, i, "failed", None, text)
    kind, data = result[:1], result[1:]
    if kind == b"j":
        value = data.decode()
    elif kind == b"s":
        value = json.dumps(data.decode("utf-8", "surrogatepass"))
    else:
        value = json.dumps(base64.b64encode(data).decode())
    return (rid, i, "done", value, None)


def rows_of(batches: list[Any]) -> list[Row]:
    out: list[Row] = []
    for b in batches:
        assert b.schema.names == ["id", "index", "status", "result", "error"]
        d = b.to_pydict()
        out += list(zip(d["id"], d["index"], d["status"], d["result"], d["error"]))
    return out


def store(r: redis.Redis, jk: JobKeys, results: dict[int, bytes], errors: dict[int, bytes],
          ids: dict[int, bytes]) -> None:
    for key, values in ((jk.results, results), (jk.errors, errors), (jk.ids, ids)):
        if values:
            r.hset(key, mapping={str(i): v for i, v in values.items()})


def expected(lo: int, hi: int, results: dict[int, bytes], errors: dict[int, bytes],
             ids: dict[int, bytes]) -> list[Row]:
    rows = (expected_row(i, results.get(i), errors.get(i), ids.get(i)) for i in range(lo, hi))
    return [row for row in rows if row is not None]


def test_a_range_reads_back_every_kind_of_result_error_and_gap(
        r: redis.Redis, redis_url: str) -> None:
    # Given a job whose first chunk holds only JSON results (with gaps and a large one)
    # and whose second holds every stored form: str, bytes, empty, non-UTF-8 str,
    # failures with a JSON record, a non-JSON record, a non-object record, a failure
    # that also has a result, indexes with no id, and unsettled indexes
    jk = JobKeys("mixed", "q")
    results = {i: b"j" + json.dumps({"i": i, "name": f"n-{i}"}).encode()
               for i in range(0, 2 * READ_CHUNK) if i % 7}
    results[5] = b"j" + json.dumps("x" * 200_000).encode()
    c = READ_CHUNK + 2  # a multiple of 7: no result
    more = {c - 1: b"shello \xc3\xa9", c + 1: b"b\x00\xff\x10", c + 3: b"",
            c + 4: b"s\xed\xa0\x80", c + 5: b"j[1,2,3]", READ_CHUNK + 8: b"snot json"}
    results.update(more)
    errors = {c: json.dumps({"error": "Boom: bad row", "attempts": 5}).encode(),
              c + 7: b"not json at all \xff",
              c + 14: json.dumps(["a", "list"]).encode(),
              READ_CHUNK + 8: json.dumps({"error": "old failure"}).encode()}
    ids = {i: f"{i % 3}:{i}".encode() for i in range(2 * READ_CHUNK) if i % 11}
    store(r, jk, results, errors, ids)
    total = 2 * READ_CHUNK + 50

    # When the whole range is read chunk by chunk, and as one partition of the batch reader
    by_chunk = [read_range(r, jk, lo, min(total, lo + READ_CHUNK))
                for lo in range(0, total, READ_CHUNK)]
    opts = SourceOptions(queue="q", job="mixed", redis_url=redis_url)
    by_partition = list(_read(opts, IndexRange(0, total)))

    # Then each is every settled index in order, as RESULT_SCHEMA defines it
    want = expected(0, total, results, errors, ids)
    assert rows_of(by_chunk) == want
    assert rows_of(by_partition) == want
    assert [row[1] for row in want if row[2] == "failed"] == [c, c + 7, c + 14]
    assert len(want) > READ_CHUNK


def test_a_job_without_failures_reads_the_same_with_or_without_the_errors_hash(
        r: redis.Redis, redis_url: str) -> None:
    # Given a job with results only (no errors hash), partly settled
    jk = JobKeys("nofail", "q")
    results = {i: b"j" + str(i).encode() for i in range(1500) if i % 5}
    ids = {i: f"0:{i}".encode() for i in range(1500)}
    store(r, jk, results, {}, ids)
    opts = SourceOptions(queue="q", job="nofail", redis_url=redis_url)
    # When it is read by partitions, then once a failure exists
    before = rows_of(list(_read(opts, IndexRange(0, 1500))))
    errors = {10: json.dumps({"error": "late"}).encode()}
    store(r, jk, {}, errors, {})
    after = rows_of(list(_read(opts, IndexRange(0, 1500))))
    # Then the first read is the done ones, the second adds the failure in its place
    assert before == expected(0, 1500, results, {}, ids)
    assert after == expected(0, 1500, results, errors, ids)
    assert len(after) == len(before) + 1
    assert rows_of([read_range(r, jk, 0, 0)]) == []


def test_settled_prefix_stops_at_the_first_index_with_neither_result_nor_error(
        r: redis.Redis) -> None:
    # Given results for 0..(2 chunks + 500) except a failure at 1500 (error only) and a
    # gap at READ_CHUNK + 100 (past the first chunk)
    jk = JobKeys("prefix", "q")
    end = 2 * READ_CHUNK + 500
    gap = READ_CHUNK + 100
    results = {i: b"j1" for i in range(end) if i not in (1500, gap)}
    store(r, jk, results, {1500: b'{"error": "x"}'}, {})
    prefix = StreamqStreamReader._settled_prefix
    # Then the prefix reaches the gap, from 0 and from inside the settled part
    assert prefix(r, jk, 0, end + 1000) == gap
    assert prefix(r, jk, 1500, end + 1000) == gap
    assert prefix(r, jk, 0, 1000) == 1000  # bounded by hi
    assert prefix(r, jk, 5, 5) == 5
    # When the gap settles by a failure, then the prefix reaches the end of the results
    store(r, jk, {}, {gap: b'{"error": "y"}'}, {})
    assert prefix(r, jk, 0, end + 1000) == end
    assert prefix(r, jk, gap + 1, end) == end
