"""The small-job lane: jobs of one sub-request on shared streams, settled by one script.

A job of one sub-request does not need a stream, a consumer group and tokens of
its own. On the lane it is one entry (fields ``j`` job id, ``t`` type, ``p``
payload; ``a`` attempts and ``s`` suspect after a retry or a recovery) of its
shard's lane stream for its priority and client, ``sq:{<shard>}:lane:<p>:<c>``,
and one JSON record in the shard's ``ljobs`` hash. A worker reads every lane of
a shard with one XREADGROUP (a fair share of each client's stream), runs the
entries in priority order, and one ``lane_ack`` call per stream acknowledges
them, stores their results, completes the jobs and records and publishes each
completion once: everything of a small job lives in its shard's slot, so there
is no cross-slot step and no token. A submit is one script in one round trip.

Lane jobs have generated ids: a job's shard is the one its id names, which is
how readers find it (:func:`shard_of_job`).

A finished small job is forgotten once its retention passed, by Redis's clock, as a
job lane job's keys expire then: every reader asks :func:`kept`, so a record that no
trim removed yet (trims run inside other lane calls and reaper passes) shows nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis

from streamq.base import config
from streamq.base.codec import decode_result
from streamq.base.keys import QueueKeys, shard_queue
from streamq.base.members import parse_lane_member
from streamq.base.models import JobState, JobStatus
from streamq.services.shards import shard_index
from streamq.storage.connection import server_ms

if TYPE_CHECKING:
    from streamq.model.queue_view import QueueStore as Queue
    from streamq.storage.connection import Client

#: ``lkept`` entries read per round trip by :func:`kept`
KEPT_PAGE = 500


def enabled() -> bool:
    """Whether one-entry jobs ride the lane (``STREAMQ_LANE=0`` turns it off)."""
    return os.environ.get("STREAMQ_LANE", "1") != "0"


def submit(q: Queue, jobs: Sequence[tuple[str, tuple[bytes, bytes]]], priority: int,
           client: str, max_deliveries: int) -> None:
    """Submit lane jobs (id, encoded payload), grouped by shard, in one round trip."""
    shards = q.shards
    by_shard: dict[int, list[tuple[str, bytes, bytes]]] = {}
    for jid, (kind, payload) in jobs:
        by_shard.setdefault(shard_index(jid, len(shards)), []).append((jid, kind, payload))
    calls = [q.scripts.lane_submit_call(shards[k], priority, client, q.retention_ms,
                                        max_deliveries, group[s : s + config.LANE_SUBMIT_CHUNK])
             for k, group in by_shard.items()
             for s in range(0, len(group), config.LANE_SUBMIT_CHUNK)]
    q.scripts.run_many(calls)


def shard_of_job(shards: Sequence[QueueKeys], job_id: str) -> QueueKeys:
    return shards[shard_index(job_id, len(shards))]


def parse(raw: Any, tag: str) -> dict[str, Any]:
    """A small job's record (raw, of shard ``tag``) as a dict, in either form
    (lua/includes/lane_complete.lua): the JSON of a job that has not succeeded, or
    the short record of one that did (its result: :func:`result_of`)."""
    b = raw if isinstance(raw, bytes) else str(raw).encode()
    if b[:1] != b"S":
        return dict(json.loads(b))
    head = b.split(b"\n", 1)[0].decode()
    parts = head[1:].split("|")
    finished, took = int(parts[0]), int(parts[1])
    if len(parts) >= 5:
        priority, client, max_deliveries = int(parts[2]), parts[3], int(parts[4])
    else:
        priority, client = config.DEFAULT_PRIORITY, config.DEFAULT_CLIENT
        max_deliveries = config.DEFAULT_MAX_DELIVERIES
    return {"state": JobState.SUCCEEDED.value, "done": 1, "failed": 0, "finished": finished,
            "queue": tag, "priority": priority, "client": client,
            "max_deliveries": max_deliveries, "created": finished - took}


def result_of(raw: Any) -> bytes | None:
    """The encoded result a small job's record holds (one that succeeded, its result at
    most 1 KiB: a bigger one is in ``lresults``), else None."""
    b = raw if isinstance(raw, bytes) else str(raw).encode()
    if b[:1] != b"S":
        return None
    head, sep, result = b.partition(b"\n")
    return result if sep else None


def status(job_id: str, rec: dict[str, Any], held: bool = False) -> JobStatus:
    """A lane job's status from its record; ``held``: a worker holds its entry (see
    :func:`held`), which is then in flight rather than queued, as on the job lane."""
    active = rec.get("state") == JobState.ACTIVE.value
    finished = rec.get("finished")
    return JobStatus(
        job_id=job_id, queue=shard_queue(str(rec["queue"])), state=JobState(rec["state"]),
        priority=int(rec["priority"]), concurrency=1, client=str(rec["client"]), total=1,
        done=int(rec.get("done", 0)), failed=int(rec.get("failed", 0)),
        in_flight=1 if held else 0, queued=1 if active and not held else 0,
        created_ms=int(rec.get("created", 0)), finished_ms=int(finished) if finished else None)


def held(client: Client, qk: QueueKeys, job_id: str, rec: dict[str, Any]) -> bool:
    """Whether a worker holds the entry of small job ``job_id`` (read, not acknowledged).

    Only a job that is active, or cancelled while held, can have one. A lane stream
    keeps its unsettled entries only (a settled entry is deleted in the settling
    script, and a retried or reclaimed one is added again at the end), so the
    entries up to its group's last-delivered id are exactly those workers hold:
    they are scanned, never the backlog behind them."""
    if rec.get("state") not in (JobState.ACTIVE.value, JobState.CANCELLED.value):
        return False
    stream = qk.lane(int(rec["priority"]), str(rec["client"]))
    try:
        groups: Any = client.xinfo_groups(stream)
    except redis.ResponseError:
        return False  # no stream: nothing of the lane is held
    last = next((g["last-delivered-id"] for g in groups
                 if g["name"] in (config.GROUP, config.GROUP.encode())), None)
    if last is None:
        return False
    me, start = job_id.encode(), "-"
    while True:
        got: Any = client.xrange(stream, start, last, count=1000)
        if any(f.get(b"j") == me for _, f in got):
            return True
        if len(got) < 1000:
            return False
        start = "(" + (got[-1][0].decode() if isinstance(got[-1][0], bytes) else got[-1][0])


def results(client: Client, qk: QueueKeys, job_id: str) -> dict[int, Any]:
    """A small job's result: in its record when it succeeded, in ``lresults`` when it
    ran to its end after a cancel (one round trip)."""
    pipe = client.pipeline(transaction=False)
    pipe.hget(qk.ljobs, job_id)
    pipe.hget(qk.lresults, job_id)
    rec, raw = pipe.execute()
    got = (result_of(rec) if rec is not None else None) or raw
    return {} if got is None else {0: decode_result(got)}


def settled(client: Client, qk: QueueKeys, job_id: str
            ) -> tuple[dict[str, Any], bytes | None, bytes | None] | None:
    """A kept small job of shard ``qk`` as a reader of stored values sees it: its record,
    its encoded result (type letter + bytes, as :func:`results` reads it) and its error
    record (JSON, as a job lane job's ``errors`` holds it), None for each it has not;
    None when no such job is kept (:func:`kept_records`)."""
    raw = kept_records(client, [(qk, job_id)])[0]
    if raw is None:
        return None
    pipe = client.pipeline(transaction=False)
    pipe.hget(qk.lresults, job_id)
    pipe.hget(qk.lerrors, job_id)
    result, error = pipe.execute()
    return parse(raw, qk.tag), result_of(raw) or result, error


def backlog(client: Client, qk: QueueKeys) -> dict[int, tuple[int, int, int]]:
    """Per priority, the shard's small jobs (queued, in flight, retrying): entries not
    delivered yet, delivered and not acknowledged, and waiting for their retry."""
    members: Any = client.zrange(qk.lanes, 0, -1)
    if not members:
        return {}
    lanes = [parse_lane_member(m.decode() if isinstance(m, bytes) else m) for m in members]
    pipe = client.pipeline(transaction=False)
    for p, c in lanes:
        pipe.xlen(qk.lane(p, c))
        pipe.xpending(qk.lane(p, c), config.GROUP)
        pipe.zcard(qk.lane_retry(p, c))
    got = pipe.execute(raise_on_error=False)
    out: dict[int, tuple[int, int, int]] = {}
    for n, (p, _) in enumerate(lanes):
        length, summary, retrying = got[3 * n : 3 * n + 3]
        pending = int(summary["pending"]) if isinstance(summary, dict) else 0
        length = int(length) if isinstance(length, int) else 0
        retrying = int(retrying) if isinstance(retrying, int) else 0
        q, f, rt = out.get(p, (0, 0, 0))
        out[p] = (q + max(0, length - pending), f + pending, rt + retrying)
    return out


def _forget_after(raw: Any, score: Any) -> tuple[int, int] | None:
    """When a small job's record may be forgotten (ms, Redis's clock: its finish + its
    retention, as lua/includes/lane_complete.lua keeps it) and its finish, from the
    record and its ``ldone`` score as read: None while it has not finished (or for a
    record that is not a small job's: its reader says so); (-1, finish) when only its
    ``lkept`` entry tells (the short record of a job that succeeded names no
    retention)."""
    try:
        rec = parse(raw, "")
        if rec.get("state") not in _FINISHED or not rec.get("finished"):
            return None
        finished = int(rec["finished"])
        if score is not None:
            return int(float(score)), finished
        if rec.get("retention") is None:
            return -1, finished
        return finished + int(rec["retention"]), finished
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


_FINISHED = frozenset(s.value for s in JobState if s not in (
    JobState.OPEN, JobState.ACTIVE, JobState.SCHEDULED))


def kept(client: Client, jobs: Sequence[tuple[QueueKeys, str, Any, Any]]) -> list[bool]:
    """Whether each small job (its shard, id, record and ``ldone`` score as read, None
    for none) is still kept: False for no record, or for a finished job whose retention
    passed by Redis's clock (its shard's, read after the records), whether or not a trim
    removed its record yet.

    A record that names its retention says when; a job in ``ldone`` has that time as
    its score; the short record of a job that succeeded is forgotten when an ``lkept``
    entry at or before the clock names it (an entry's id is its jobs' finish + their
    retention: the entries from its finish to the clock are read, those no trim
    removed yet)."""
    times = [None if raw is None else _forget_after(raw, score) for _, _, raw, score in jobs]
    clocks: dict[str, int] = {}
    asked: dict[str, tuple[QueueKeys, dict[bytes, int]]] = {}
    out = []
    for (qk, job_id, raw, _), forget in zip(jobs, times):
        if raw is None or forget is None:
            out.append(raw is not None)
            continue
        if qk.tag not in clocks:
            clocks[qk.tag] = server_ms(client, qk.ljobs)
        if forget[0] >= 0:
            out.append(forget[0] > clocks[qk.tag])
            continue
        asked.setdefault(qk.tag, (qk, {}))[1][job_id.encode()] = forget[1]
        out.append(True)  # unless an lkept entry names it (below)
    passed: set[tuple[str, bytes]] = set()
    for tag, (qk, finishes) in asked.items():
        passed |= {(tag, j) for j in _named(client, qk, finishes, clocks[tag])}
    return [ok and (qk.tag, job_id.encode()) not in passed
            for ok, (qk, job_id, _, _) in zip(out, jobs)]


def _named(client: Client, qk: QueueKeys, finishes: dict[bytes, int], now: int
           ) -> set[bytes]:
    """Those of the jobs (id -> finish ms) of shard ``qk`` whose ``lkept`` entry (its id
    their finish + their retention) is at or before ``now``, read in a bounded number
    of commands: the KEPT_PAGE entries from each finish on, then the entry at each
    finish + each retention those entries name (and the default). A job whose retention
    none of them names counts as kept until a trim forgets it."""
    by_finish: dict[int, set[bytes]] = {}
    for job, finish in finishes.items():
        by_finish.setdefault(finish, set()).add(job)
    pipe = client.pipeline(transaction=False)
    for finish in by_finish:
        pipe.xrange(qk.lkept, finish, now, count=KEPT_PAGE)
    found: set[bytes] = set()
    looks: list[tuple[set[bytes], int]] = []
    for (finish, names), got in zip(by_finish.items(), pipe.execute()):
        found |= names & _names(got)
        retentions = _retentions(got) | {config.DEFAULT_RETENTION_S * 1000}
        looks += [(names - found, finish + r) for r in sorted(retentions)
                  if finish + r <= now and names - found]
    for (names, _), named in zip(looks, _named_at(client, qk, [at for _, at in looks])):
        found |= names & named
    return found


def retention_ms(client: Client, qk: QueueKeys, job_id: str, finished_ms: int,
                 default_ms: int | None = None, cap: int = 100) -> int | None:
    """The retention a finished small job is kept for, when its record no longer says it
    (a job that succeeded keeps a short record): its forget-after time in ``ldone``, or
    the ``lkept`` entry naming it, whose id is its finish + that retention. The
    retentions tried in ``lkept``: ``default_ms`` and those of the entries around its
    finish and at the stream's end (``cap`` of each). None when neither names it."""
    score: Any = client.zscore(qk.ldone, job_id)
    if score is not None:
        return int(score) - finished_ms
    pipe = client.pipeline(transaction=False)
    pipe.xrange(qk.lkept, finished_ms, "+", count=cap)
    pipe.xrevrange(qk.lkept, "+", finished_ms, count=cap)
    tried = set() if default_ms is None else {default_ms}
    for entries in pipe.execute():
        tried |= _retentions(entries)
    candidates = sorted(tried)
    named = _named_at(client, qk, [finished_ms + r for r in candidates])
    return next((r for r, names in zip(candidates, named) if job_id.encode() in names), None)


def _names(entries: Any) -> set[bytes]:
    """The jobs ``lkept`` entries name (their ``j``)."""
    return {j for _, f in entries for j in (f.get(b"j") or b"").split()}


def _retentions(entries: Any) -> set[int]:
    """The retentions (ms) ``lkept`` entries name (their ``r``)."""
    return {int(f[b"r"]) for _, f in entries if (f.get(b"r") or b"").isdigit()}


def _named_at(client: Client, qk: QueueKeys, ats: Sequence[int]) -> list[set[bytes]]:
    """The jobs named by the ``lkept`` entries at each forget-after time (ms) of
    ``ats`` (an entry's id: its jobs' finish + their retention), in one round trip."""
    pipe = client.pipeline(transaction=False)
    for at in ats:
        pipe.xrange(qk.lkept, f"{at}-0", f"{at}-18446744073709551615")
    return [_names(got) for got in pipe.execute()] if ats else []


def kept_records(client: Client, jobs: Sequence[tuple[QueueKeys, str]]) -> list[Any]:
    """The records of small jobs (shard, id) that are still kept (:func:`kept`), None
    for one that is not (one round trip; more when one has finished: :func:`kept`)."""
    pipe = client.pipeline(transaction=False)
    for qk, job_id in jobs:
        pipe.hget(qk.ljobs, job_id)
        pipe.zscore(qk.ldone, job_id)
    got = pipe.execute()
    read = [(qk, j, got[2 * n], got[2 * n + 1]) for n, (qk, j) in enumerate(jobs)]
    return [raw if ok else None for (_, _, raw, _), ok in zip(read, kept(client, read))]
