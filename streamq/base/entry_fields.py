"""The fields of a stream entry as workers read them: an entry's index, type,
payload, attempt count and whether it is suspect; and the batches of results a slot
acknowledges. No Redis here: both lanes' work reads entries through these.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from streamq.base.codec import decode
from streamq.base.keys import JobKeys
from streamq.errors import PayloadError

__all__ = ["Batch", "LaneEntry", "batch_ids", "is_suspect", "streams_read"]

#: a job and the results of its entries to acknowledge: (entry id, index, encoded result)
Batch = tuple[JobKeys, list[tuple[str, int, bytes]]]


def batch_ids(batches: Sequence[Batch]) -> list[tuple[str, list[str]]]:
    """The job and entry ids of each batch of results."""
    return [(jk.job_id, [d[0] for d in done]) for jk, done in batches]


def queued_s(eid: str, flat: list[bytes]) -> float:
    """When an entry was queued, s since the epoch (Redis's clock): its id's time, or
    for a copy handed back unstarted (includes/hand_back.lua) the time in its last
    field ``q``, when the entry was first queued."""
    if len(flat) >= 2 and flat[-2] == b"q" and flat[-1].isdigit():
        return int(flat[-1]) / 1000
    return int(eid[:eid.find("-")]) / 1000


def _fields(flat: list[bytes]) -> dict[bytes, bytes]:
    it = iter(flat)
    return dict(zip(it, it))


#: an index or count as the functions write it and read it back (fail-8.lua): 1-9
#: digits (the contracts take none from 10^9 on); anything else (a sign, spaces,
#: "_", more digits) is no index
_DIGITS = re.compile(rb"[0-9]{1,9}")


def _int_field(fields: dict[bytes, bytes], name: bytes) -> int | None:
    value = fields.get(name)
    return int(value) if value is not None and _DIGITS.fullmatch(value) else None


def _plain(flat: list[bytes]) -> bool:
    """The layout every first attempt has (``i``, ``t``, ``p``): read without a dict."""
    return len(flat) == 6 and flat[0] == b"i" and flat[2] == b"t" and flat[4] == b"p"


def _parse(flat: list[bytes]) -> tuple[int | None, bytes | None, bytes | None, int, bool]:
    """An entry's index, type, payload, attempt number and whether it is suspect."""
    if _plain(flat):
        return (int(flat[1]) if _DIGITS.fullmatch(flat[1]) else None), flat[3], flat[5], 1, False
    fields = _fields(flat)
    attempt = 1 if b"a" not in fields else (_int_field(fields, b"a") or 0) + 1
    return (_int_field(fields, b"i"), fields.get(b"t"), fields.get(b"p"), attempt,
            b"s" in fields)


def _checked(job: str, index: int | None, kind: bytes | None, raw: bytes | None
             ) -> tuple[int, bytes, bytes, Any]:
    """A parsed entry's index, type and payload, and the payload decoded; PayloadError
    when the entry is malformed (``job``: the job it names; "" for a lane entry that
    names none)."""
    if not job:
        raise PayloadError("missing job 'j' field")
    if index is None:
        raise PayloadError("missing or invalid index field 'i'")
    if kind is None or raw is None:
        raise PayloadError("missing type 't' or payload 'p' field")
    return index, kind, raw, decode(kind, raw)


def is_suspect(flat: list[bytes]) -> bool:
    """True for an entry the reaper took from a dead worker (field ``s``)."""
    return not _plain(flat) and b"s" in flat[0::2]


def _job_of(fields: dict[bytes, bytes]) -> str:
    """The job id a lane entry's fields name (``j``; "" when it has none)."""
    return fields.get(b"j", b"").decode("utf-8", "replace")


def _lane_fields(flat: list[bytes]) -> tuple[str, bytes | None, bytes | None, int]:
    """A lane entry's job id ("" when it has none), type, payload and attempt number.
    Every first attempt without a trace context has the layout ``j``, ``t``, ``p``
    and is read without a dict."""
    if len(flat) == 6 and flat[0] == b"j" and flat[2] == b"t" and flat[4] == b"p":
        return flat[1].decode("utf-8", "replace"), flat[3], flat[5], 1
    f = _fields(flat)
    try:
        attempt = int(f.get(b"a", b"0")) + 1
    except ValueError:
        attempt = 1
    return _job_of(f), f.get(b"t"), f.get(b"p"), attempt


class LaneEntry(NamedTuple):
    """One entry read from a lane stream."""

    priority: int
    client: str
    stream: str
    eid: str
    flat: list[bytes]


def streams_read(reply: Any) -> list[tuple[str, list[tuple[bytes, list[bytes]]]]]:
    """(stream, entries) of a raw XREADGROUP reply over several streams (RESP2 list
    or RESP3 map; nil when nothing was read)."""
    if not reply:
        return []
    pairs = reply.items() if isinstance(reply, dict) else [(s[0], s[1]) for s in reply]
    out = []
    for stream, entries in pairs:
        name = stream.decode() if isinstance(stream, bytes) else str(stream)
        out.append((name, [(eid, flat or []) for eid, flat in entries]))
    return out


def _tiers(lanes: Sequence[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """``lanes`` grouped by priority, most urgent first."""
    out: dict[int, list[tuple[int, str]]] = {}
    for lane in sorted(lanes):
        out.setdefault(lane[0], []).append(lane)
    return list(out.values())
