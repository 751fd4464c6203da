"""Sub-request ids that do not depend on the order rows arrive in.

A Spark task that is retried (or run speculatively) may receive its
partition's rows in another order: after any shuffle the order depends on
which map outputs arrive first. So a row's id never comes from its position:

* with a key column (``option("keyColumn", "order_id")``), a row's id is its
  key (as text) and its digest is a hash of the row's encoded bytes. A key
  must be unique: twice in one partition is an error here, in two
  partitions an error of the fenced add (the stored partition differs);
* without one, a row's id is ``<partition>:<digest>:<occurrence>``: the hash of
  its encoded bytes plus how many identical rows of the partition came
  before it, so identical rows stay distinct and the set of ids is the same
  for the same rows in any order. The digest is part of the id.

Chunks of ``rowsPerRequest`` > 1 rows are cut from the partition's rows sorted
by the key column (or by every column: rows equal in every column are
identical), so a chunk holds the same rows on every attempt; its id is
``<partition>:c<number>`` and its digest a hash of its payload. That needs the
partition's rows (as Arrow batches) in memory until the task has read them all.

The digest is BLAKE2b of 12 bytes, as 24 hex digits.

Rows are encoded as JSON objects (:func:`encode_row`). Flat rows whose
columns are integers, booleans, floats or strings (sent alone or in chunks)
are encoded in Arrow, column by column (:func:`json_rows`), to the same bytes,
without a Python dict per row; other types go through :func:`encode_row`.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import json
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from ..errors import PayloadError, PayloadTooLarge, RowConflict

_blake2b = hashlib.blake2b


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


_encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=_json_default)


def encode_row(value: Any) -> bytes:
    """A row (dict) as JSON: dates ISO 8601, decimals as strings, binary as base64.
    Raises PayloadError."""
    try:
        return _encoder.encode(value).encode()
    except (TypeError, ValueError) as e:
        raise PayloadError(f"a row is not JSON serialisable: {e}") from None


def digest(data: bytes) -> str:
    """The digest of an encoded row or chunk: BLAKE2b-96, hex (24 chars)."""
    return _blake2b(data, digest_size=12).hexdigest()


def key_text(value: Any) -> str:
    """A key column's value as the text of an id."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        return _encoder.encode(value)
    return str(value)


def _text(value: str) -> Any:
    return pa.scalar(value, pa.large_string())


#: A character that JSON (ASCII only, as :func:`encode_row`) writes escaped.
_ESCAPED = r'[^ !#-\[\]-~]'


def _value_texts(col: Any) -> Any:
    """A column's values as JSON texts (large_string, null as ``null``), as
    :func:`encode_row` writes them; None for a type it leaves to :func:`encode_row`."""
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):  # Arrow's text is Python's
        out = pc.cast(col, pa.large_string())
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        if pc.any(pc.match_substring_regex(col, _ESCAPED)).as_py():
            out = pa.array([None if v is None else encode_basestring_ascii(v)
                            for v in col.to_pylist()], pa.large_string())
        else:
            out = pc.binary_join_element_wise(_text('"'), pc.cast(col, pa.large_string()),
                                              _text('"'), _text(""))
    elif pa.types.is_floating(t) and not pa.types.is_float16(t):
        if col.null_count < len(col) and not pc.all(pc.is_finite(col)).as_py():
            return None  # NaN or infinity: encode_row raises the error
        out = pa.array([None if v is None else float.__repr__(v) for v in col.to_pylist()],
                       pa.large_string())
    else:
        return None
    return pc.fill_null(out, _text("null")) if col.null_count else out


def json_rows(table: pa.Table) -> Any:
    """Each row of ``table`` as a JSON object, the bytes :func:`encode_row` makes of
    its dict (large_string array); None when a column's type is not an integer,
    boolean, float or string, or two columns share a name."""
    names = table.column_names
    if not names or len(set(names)) != len(names):
        return None
    parts: list[Any] = []
    for k, name in enumerate(names):
        texts = _value_texts(table.column(name).combine_chunks())
        if texts is None:
            return None
        parts += [_text(("{" if k == 0 else ",") + encode_basestring_ascii(name) + ":"), texts]
    return pc.binary_join_element_wise(*parts, _text("}"), _text(""))


def json_chunks(rows: Any, n: int) -> list[bytes]:
    """JSON lists of ``n`` consecutive rows of ``rows`` (from :func:`json_rows`)."""
    offsets = pa.array([*range(0, len(rows), n), len(rows)], pa.int64())
    lists = pa.LargeListArray.from_arrays(offsets, rows)
    joined = pc.binary_join_element_wise(_text("["), pc.binary_join(lists, _text(",")),
                                         _text("]"), _text(""))
    chunks: list[bytes] = pc.cast(joined, pa.large_binary()).to_pylist()
    return chunks


class RowIds:
    """The ids of one partition's rows (see the module docstring)."""

    def __init__(self, partition: int, key_column: str | None, max_bytes: int) -> None:
        self.partition, self.key_column, self.max_bytes = partition, key_column, max_bytes
        self._seen: set[str] = set()  # keys of this partition (key mode)
        self._count: dict[str, int] = {}  # digest -> identical rows so far (content mode)

    def null_key(self) -> PayloadError:
        return PayloadError(f"keyColumn {self.key_column!r} is null in a row of partition "
                            f"{self.partition}: every row needs a key")

    def duplicate_key(self, key: str) -> RowConflict:
        return RowConflict(f"keyColumn {self.key_column!r} is not unique: {key!r} appears "
                           f"twice in partition {self.partition}")

    def _check_size(self, sub_id: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            raise PayloadTooLarge(f"sub-request {sub_id} is {len(data)} bytes, over the limit "
                                  f"of {self.max_bytes} bytes (lower rowsPerRequest)")

    def entries(self, rows: list[dict[str, Any]]) -> list[tuple[str, str, bytes, bytes]]:
        """The add_keyed entries (id, digest, type, JSON) of rows sent one per
        sub-request; the digest is "" when the id carries it (content ids)."""
        encode = _encoder.encode
        try:
            datas = [encode(row).encode() for row in rows]
        except (TypeError, ValueError) as e:
            raise PayloadError(f"a row is not JSON serialisable: {e}") from None
        key = self.key_column
        return self._entries(datas, None if key is None else [row.get(key) for row in rows])

    def batch_entries(self, batch: pa.RecordBatch) -> list[tuple[str, str, bytes, bytes]]:
        """:meth:`entries` of a record batch's rows, encoded in Arrow where
        :func:`json_rows` can (the same bytes)."""
        key, texts = self.key_column, None
        if key is None or batch.schema.get_field_index(key) >= 0:
            texts = json_rows(pa.Table.from_batches([batch]))
        if texts is None:
            return self.entries(batch.to_pylist())
        datas: list[bytes] = pc.cast(texts, pa.large_binary()).to_pylist()
        return self._entries(datas, None if key is None else batch.column(key).to_pylist())

    def _entries(self, datas: list[bytes],
                 keys: list[Any] | None) -> list[tuple[str, str, bytes, bytes]]:
        """Entries of encoded rows: under their keys, or content ids when ``keys`` is None."""
        b2, limit = _blake2b, self.max_bytes
        out = []
        if keys is None:
            count, prefix = self._count, f"{self.partition}:"
            for data in datas:
                d = b2(data, digest_size=12).hexdigest()
                n = count.get(d, 0)
                count[d] = n + 1
                sub_id = f"{prefix}{d}:{n}"
                if len(data) > limit:
                    self._check_size(sub_id, data)
                out.append((sub_id, "", b"j", data))
            return out
        seen = self._seen
        try:
            for data, value in zip(datas, keys):
                if value is None:
                    raise self.null_key()
                sub_id = key_text(value)
                if sub_id in seen:
                    raise self.duplicate_key(sub_id)
                seen.add(sub_id)
                if len(data) > limit:
                    self._check_size(sub_id, data)
                out.append((sub_id, b2(data, digest_size=12).hexdigest(), b"j", data))
        except (TypeError, ValueError) as e:
            raise PayloadError(f"a key is not JSON serialisable: {e}") from None
        return out


class Chunker:
    """Collects a partition's record batches, then cuts its rows into chunks in key
    order: sorted by the key column, or by every column (rows equal in every column
    are identical), with Arrow; by the encoded rows where Arrow cannot sort a
    column's type (nested types)."""

    def __init__(self, ids: RowIds, rows_per_chunk: int) -> None:
        self.ids, self.n = ids, rows_per_chunk
        self._batches: list[pa.RecordBatch] = []

    def add_batch(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self._batches.append(batch)

    def _sorted(self) -> tuple[pa.Table | None, list[Any]]:
        """The partition's rows in key order: as a table, or as row dicts where Arrow
        cannot sort them."""
        table = pa.Table.from_batches(self._batches)
        self._batches = []
        key = self.ids.key_column
        if key is not None:
            col = table.column(key)
            if col.null_count:
                raise self.ids.null_key()
            if len(pc.unique(col)) != len(col):
                counts = pc.value_counts(col)
                dup = next(v["values"] for v in counts.to_pylist() if v["counts"] > 1)
                raise self.ids.duplicate_key(key_text(dup))
            return table.take(pc.sort_indices(table, [(key, "ascending")])), []
        try:
            order = pc.sort_indices(table, [(c, "ascending") for c in table.column_names])
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid):
            rows: list[Any] = table.to_pylist()
            return None, [row for _, row in sorted(((encode_row(row), n), row)
                                                   for n, row in enumerate(rows))]
        return table.take(order), []

    def _payloads(self) -> list[bytes]:
        table, rows = self._sorted()
        if table is not None:
            texts = json_rows(table)
            if texts is not None:
                return json_chunks(texts, self.n)
            rows = table.to_pylist()
        return [encode_row(rows[start:start + self.n]) for start in range(0, len(rows), self.n)]

    def chunks(self) -> Iterator[tuple[str, str, bytes]]:
        """(id, digest, JSON list payload) of each chunk, in key order."""
        if not self._batches:
            return
        prefix = f"{self.ids.partition}:c"
        for k, payload in enumerate(self._payloads()):
            sub_id = f"{prefix}{k}"
            self.ids._check_size(sub_id, payload)
            yield sub_id, digest(payload), payload
