"""The fields of a stream entry as workers read them: an entry's index, type,
payload, attempt count and whether it is suspect; and the batches of results a slot
acknowledges. No Redis here: both lanes' work reads entries through these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .codec import decode
from .errors import PayloadError
from .keys import JobKeys

__all__ = ["Batch", "batch_ids", "is_suspect"]

#: a job and the results of its entries to acknowledge: (entry id, index, encoded result)
Batch = tuple[JobKeys, list[tuple[str, int, bytes]]]


def batch_ids(batches: Sequence[Batch]) -> list[tuple[str, list[str]]]:
    """The job and entry ids of each batch of results."""
    return [(jk.job_id, [d[0] for d in done]) for jk, done in batches]


def _fields(flat: list[bytes]) -> dict[bytes, bytes]:
    it = iter(flat)
    return dict(zip(it, it))


def _int_field(fields: dict[bytes, bytes], name: bytes) -> int | None:
    try:
        value = int(fields[name])
    except (KeyError, ValueError):
        return None
    return value if value >= 0 else None


def _plain(flat: list[bytes]) -> bool:
    """The layout every first attempt has (``i``, ``t``, ``p``): read without a dict."""
    return len(flat) == 6 and flat[0] == b"i" and flat[2] == b"t" and flat[4] == b"p"


def _parse(flat: list[bytes]) -> tuple[int | None, bytes | None, bytes | None, int, bool]:
    """An entry's index, type, payload, attempt number and whether it is suspect."""
    if _plain(flat):
        index: int | None
        try:
            index = int(flat[1])
        except ValueError:
            index = None
        return (index if index is None or index >= 0 else None), flat[3], flat[5], 1, False
    fields = _fields(flat)
    attempt = 1 if b"a" not in fields else (_int_field(fields, b"a") or 0) + 1
    return (_int_field(fields, b"i"), fields.get(b"t"), fields.get(b"p"), attempt,
            b"s" in fields)


def _checked(index: int | None, kind: bytes | None, raw: bytes | None
             ) -> tuple[int, bytes, bytes, Any]:
    """A parsed entry's index, type and payload, and the payload decoded; PayloadError
    when the entry is malformed."""
    if index is None:
        raise PayloadError("missing or invalid index field 'i'")
    if kind is None or raw is None:
        raise PayloadError("missing type 't' or payload 'p' field")
    return index, kind, raw, decode(kind, raw)


def is_suspect(flat: list[bytes]) -> bool:
    """True for an entry the reaper took from a dead worker (field ``s``)."""
    return not _plain(flat) and b"s" in flat[0::2]
