"""What the small-job lane holds of its jobs besides their records: the entries workers
hold (read, not acknowledged), the retries waiting and the entries queued, read as the
job lane's readers read a job's stream, pending list and retry set, so every view shows
a small job as it shows the same job on a stream of its own (one promise, both paths).
The retention a finished job is kept for is :func:`streamq.producer.lane.retention_ms`.

Plain reads (XPENDING, XRANGE, ZRANGE), bounded by ``cap`` entries a key, with
only the commands the read-only ``inspector`` role allows.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamq.base import config
from streamq.base.members import parse_lane_member

if TYPE_CHECKING:
    from streamq.base.keys import QueueKeys
    from streamq.storage.connection import Client

#: Entries read at most from one lane stream, pending list or retry set.
CAP = 10_000

Lane = tuple[int, str]  #: (priority, client)


def _s(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


@dataclass(frozen=True)
class Held:
    """A lane entry a worker holds: read by ``consumer``, not acknowledged."""

    job_id: str
    entry_id: str
    consumer: str
    idle_ms: int  #: since its delivery (XPENDING)
    deliveries: int  #: times delivered (XPENDING), as a job stream entry's
    priority: int
    client: str
    kind: bytes  #: the payload's type
    payload: bytes  #: the encoded payload


def _entries(reply: Any) -> list[Any]:
    """An XRANGE reply's entries (none for an error)."""
    return reply if isinstance(reply, list) else []


def lanes_of(client: Client, qk: QueueKeys) -> list[Lane]:
    """The shard's lanes (its ``lanes`` registry)."""
    members: Any = client.zrange(qk.lanes, 0, -1)
    return [parse_lane_member(_s(m)) for m in members]


def held(client: Client, qk: QueueKeys, lanes: Iterable[Lane] | None = None, *,
         jobs: Collection[str] | None = None, consumer: str | None = None,
         min_idle_ms: int = 0, cap: int = CAP) -> list[Held]:
    """The entries workers hold in the shard's lanes (all, or ``lanes``), of every job or
    of ``jobs``, by ``consumer`` and idle at least ``min_idle_ms`` when given; oldest
    first in each lane. Two round trips: the pending lists, then the entries they name
    (a lane keeps its unsettled entries only, so those between its oldest and its newest
    pending one are exactly the held ones)."""
    todo = lanes_of(client, qk) if lanes is None else list(dict.fromkeys(lanes))
    if not todo:
        return []
    pipe = client.pipeline(transaction=False)
    for p, c in todo:
        pipe.xpending_range(qk.lane(p, c), config.GROUP, "-", "+", cap,
                            consumername=consumer, idle=min_idle_ms or None)
    pending = [(lane, got) for lane, got in zip(todo, pipe.execute(raise_on_error=False))
               if isinstance(got, list) and got]  # an error: no stream or no group
    if not pending:
        return []
    pipe = client.pipeline(transaction=False)
    alone = consumer is not None or min_idle_ms > 0  # others' entries lie between
    for (p, c), got in pending:
        if alone:
            for e in got:
                pipe.xrange(qk.lane(p, c), e["message_id"], e["message_id"])
        else:
            pipe.xrange(qk.lane(p, c), got[0]["message_id"], got[-1]["message_id"], count=cap)
    replies = pipe.execute(raise_on_error=False)
    if alone:  # one reply per entry: joined per lane
        it = iter(replies)
        replies = [[x for _ in got for x in _entries(next(it))] for _, got in pending]
    out: list[Held] = []
    for ((p, c), got), entries in zip(pending, replies):
        fields = {_s(i): f for i, f in entries} if isinstance(entries, list) else {}
        for e in got:
            f = fields.get(_s(e["message_id"]))
            job = _s(f.get(b"j", b"")) if f else ""
            if not job or (jobs is not None and job not in jobs):
                continue
            assert f is not None
            out.append(Held(job, _s(e["message_id"]), _s(e["consumer"]),
                            int(e["time_since_delivered"]), int(e["times_delivered"]),
                            p, c, f.get(b"t", b"b"), f.get(b"p", b"")))
    return out


def idle_times(client: Client, qk: QueueKeys, cap: int = CAP) -> list[int]:
    """How long each entry workers hold in the shard's lanes was delivered ago (ms): their
    pending lists alone (no entry is read, so no payload), ``cap`` entries a lane."""
    todo = lanes_of(client, qk)
    pipe = client.pipeline(transaction=False)
    for p, c in todo:
        pipe.xpending_range(qk.lane(p, c), config.GROUP, "-", "+", cap)
    return [int(e["time_since_delivered"]) for got in pipe.execute(raise_on_error=False)
            if isinstance(got, list) for e in got]


def retrying(client: Client, qk: QueueKeys, lanes: Iterable[Lane],
             jobs: Collection[str] | None = None, cap: int = CAP
             ) -> dict[str, tuple[int, bytes, bytes]]:
    """The small jobs whose retry waits in ``lanes``' retry sets (of ``jobs`` when
    given): job -> (attempts counted, type, encoded payload). A member is
    ``<attempts>|<job>|<type><payload>``, its job ``<job>,<trace context>`` for an
    entry that carries one."""
    todo = list(dict.fromkeys(lanes))
    pipe = client.pipeline(transaction=False)
    for p, c in todo:
        pipe.zrange(qk.lane_retry(p, c), 0, cap - 1)
    out: dict[str, tuple[int, bytes, bytes]] = {}
    for got in pipe.execute(raise_on_error=False):
        for member in got if isinstance(got, list) else []:
            parts = member.split(b"|", 2)
            if len(parts) != 3 or not parts[0].isdigit() or not parts[2]:
                continue
            job = _s(parts[1].split(b",", 1)[0])
            if jobs is None or job in jobs:
                out[job] = (int(parts[0]), parts[2][:1], parts[2][1:])
    return out


def queued(client: Client, qk: QueueKeys, lane: Lane, job_id: str, cap: int = CAP
           ) -> tuple[bytes, bytes] | None:
    """(type, encoded payload) of the small job's entry among the first ``cap`` of its
    lane, None when it is not there (or further along)."""
    got: Any = client.xrange(qk.lane(*lane), "-", "+", count=cap)
    me = job_id.encode()
    for _, f in got:
        if f.get(b"j") == me:
            return f.get(b"t", b"b"), f.get(b"p", b"")
    return None
