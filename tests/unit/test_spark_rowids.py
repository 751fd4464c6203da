"""Chunk payloads encoded in Arrow (streamq.spark.rowids.json_rows) are the bytes
encode_row makes of the same rows, whatever the values; other types fall back."""

from __future__ import annotations

import datetime
import random
from typing import Any

import pyarrow as pa
import pytest

from streamq.errors import PayloadError
from streamq.spark.rowids import Chunker, RowIds, digest, encode_row, json_chunks, json_rows

TRICKY = pa.table({
    "i8": pa.array([1, None, -128, 0, 127], pa.int8()),
    "u64": pa.array([2**64 - 1, 0, None, 5, 1], pa.uint64()),
    "i64": pa.array([-(2**63), 2**63 - 1, 0, None, -1], pa.int64()),
    "b": pa.array([True, False, None, True, False]),
    "s": pa.array(['a"b\\c', "\x00\x1f\x7f é 😀 \u2028", None, "", "plain"]),
    "f": pa.array([1.0, 1e300, None, -0.0, 0.1 + 0.2]),
    "f32": pa.array([0.1, None, 3.5, 1e-7, -2.0], pa.float32()),
    'we"ird é': pa.array([1, 2, 3, 4, 5]),
    "ls": pa.array(["x", "y", "z", None, "\n"], pa.large_string()),
    "nulls": pa.array([None] * 5, pa.int32()),
})


def test_arrow_encoding_is_byte_for_byte_encode_row() -> None:
    rows = json_rows(TRICKY)
    assert rows is not None
    assert [t.encode() for t in rows.to_pylist()] == [encode_row(d) for d in TRICKY.to_pylist()]
    for n in (1, 2, 5, 7):
        assert json_chunks(rows, n) == [encode_row(TRICKY.slice(s, n).to_pylist())
                                        for s in range(0, TRICKY.num_rows, n)]


@pytest.mark.parametrize("table", [
    pa.table({"d": pa.array([datetime.date(2024, 1, 2)])}),
    pa.table({"tags": pa.array([["a", "b"]])}),
    pa.table({"f": pa.array([float("nan")])}),
    pa.table({"f": pa.array([1.0, float("inf")])}),
    pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"]),
])
def test_other_types_are_left_to_encode_row(table: pa.Table) -> None:
    assert json_rows(table) is None


def test_rows_sent_alone_get_the_same_entries_from_arrow() -> None:
    batch = TRICKY.to_batches()[0]
    for key in (None, 'we"ird é', "i64"):
        if key is not None and TRICKY.column(key).null_count:
            with pytest.raises(PayloadError, match="null"):
                RowIds(2, key, 1 << 20).batch_entries(batch)
            continue
        assert (RowIds(2, key, 1 << 20).batch_entries(batch)
                == RowIds(2, key, 1 << 20).entries(batch.to_pylist()))
    keyed = pa.RecordBatch.from_pylist([{"k": i, "v": "x"} for i in range(5)] * 2)
    ids = RowIds(0, None, 1 << 20)
    got = ids.batch_entries(keyed)
    assert [e[0].rsplit(":", 1)[1] for e in got] == ["0"] * 5 + ["1"] * 5  # occurrences
    assert got == RowIds(0, None, 1 << 20).entries(keyed.to_pylist())
    with pytest.raises(Exception, match="not unique"):
        RowIds(0, "k", 1 << 20).batch_entries(keyed)


def chunks_of(rows: list[dict[str, Any]], n: int,
              key: str | None = None) -> list[tuple[str, str, bytes]]:
    chunker = Chunker(RowIds(3, key, 1 << 20), n)
    for start in range(0, len(rows), 7):
        chunker.add_batch(pa.RecordBatch.from_pylist(rows[start:start + 7]))
    return list(chunker.chunks())


def test_chunks_are_the_sorted_rows_encoded_and_the_same_in_any_order() -> None:
    rng = random.Random(7)
    rows: list[dict[str, Any]] = [{"id": rng.randrange(50), "name": rng.choice(["a", 'q"', "é", None]),
             "v": rng.random()} for _ in range(300)]
    got = chunks_of(rows, 16)
    expected_rows = sorted(rows, key=lambda r: (r["id"], r["name"] is None, r["name"] or "",
                                                r["v"]))
    payloads = [encode_row(expected_rows[s:s + 16]) for s in range(0, 300, 16)]
    assert got == [(f"3:c{k}", digest(p), p) for k, p in enumerate(payloads)]
    shuffled = rows[:]
    rng.shuffle(shuffled)
    assert chunks_of(shuffled, 16) == got
    keyed = [dict(r, k=n) for n, r in enumerate(rows)]
    assert chunks_of(keyed[::-1], 10, key="k") == [
        (f"3:c{k}", digest(encode_row(keyed[s:s + 10])), encode_row(keyed[s:s + 10]))
        for k, s in enumerate(range(0, 300, 10))]


def test_chunks_of_types_arrow_does_not_encode_fall_back_to_encode_row() -> None:
    rows: list[dict[str, Any]] = [{"id": i % 3, "day": datetime.date(2024, 1, 1 + i)} for i in range(6)]
    got = chunks_of(rows[::-1], 4)
    ordered = sorted(rows, key=lambda r: (r["id"], r["day"]))
    assert [p for _, _, p in got] == [encode_row(ordered[:4]), encode_row(ordered[4:])]
    with pytest.raises(PayloadError):
        chunks_of([{"f": float("nan")}], 2)
