"""The Job view's reads: a job's status, its sub-requests by state, results, errors,
dead letters and completion record.

Sub-requests are shown a page of indexes at a time. A sub-request's state comes from
where it is now: a result in ``results`` (done), an error record in ``errors`` (dead
letter), a member of ``retry`` (waiting for its next attempt), an entry in the stream
pending in the group (running) or not yet delivered (queued); a cancelled job's
sub-request that is none of these will not run (cancelled). A small job's one
sub-request is read from where its lane keeps the same things (its record, ``lresults``,
``lerrors`` and its dead letter, its lane's pending list, retry set and entries), so
it shows as the same job on a stream of its own. Each read is bounded
(:data:`SCAN_CAP` entries of the stream, the pending list and the retry set).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from streamq.base import config
from streamq.base.codec import decode, decode_result
from streamq.base.keys import JobKeys, QueueKeys
from streamq.base.models import Completion, JobState, JobStatus
from streamq.producer import lane, lane_held
from streamq.storage.connection import Client

from ..errors import StreamqError

#: Sub-requests shown on one page of the Job view.
SUB_PAGE = 100
#: Entries read at most from a job's stream, pending list and retry set.
SCAN_CAP = 10_000
#: Characters of a value shown before "show all".
PREVIEW_CHARS = 600


@dataclass
class Value:
    """A payload, result or error, as text for the page."""

    text: str
    truncated: bool

    @classmethod
    def of(cls, value: Any, limit: int | None = PREVIEW_CHARS) -> Value:
        text = render(value)
        if limit is not None and len(text) > limit:
            return cls(text[:limit], True)
        return cls(text, False)


def render(value: Any) -> str:
    """A decoded value as text: JSON pretty-printed, bytes shown with escapes."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


@dataclass
class SubRequest:
    index: int
    state: str  #: done, dead, retrying, running, queued, unknown
    attempts: int | None
    consumer: str | None = None
    idle_ms: int | None = None
    payload: Value | None = None
    result: Value | None = None
    error: Value | None = None


@dataclass
class JobDetail:
    status: JobStatus
    small: bool
    started_ms: int | None
    by_state: dict[str, int]
    subs: list[SubRequest]
    offset: int
    completion: Completion | None
    settings: dict[str, str] = field(default_factory=dict)


def _s(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _decoded(kind: bytes, payload: bytes) -> Any:
    try:
        return decode(kind, payload)
    except StreamqError:
        return payload


def _result(raw: bytes) -> Any:
    try:
        return decode_result(raw)
    except StreamqError:
        return raw


def _error(raw: bytes) -> tuple[Any, int | None]:
    try:
        rec = json.loads(raw)
        attempts = rec.get("attempts") if isinstance(rec, dict) else None
        return rec, int(attempts) if attempts is not None else None
    except (ValueError, TypeError):
        return _s(raw), None


def sub_requests(r: Client, queue: str, job_id: str, total: int, offset: int, count: int = SUB_PAGE,
                 limit: int | None = PREVIEW_CHARS, cancelled: bool = False
                 ) -> list[SubRequest]:
    """Sub-requests ``offset`` .. ``offset + count - 1`` of a (big) job; ``cancelled``: the
    job was cancelled, so one neither settled nor held will not run (``cancelled``)."""
    jk = JobKeys(job_id, queue)
    idx = list(range(max(0, offset), min(total, offset + count)))
    if not idx:
        return []
    pipe = r.pipeline(transaction=False)
    pipe.hmget(jk.results, idx)
    pipe.hmget(jk.errors, idx)
    pipe.hmget(jk.dlq, idx)
    pipe.xrange(jk.tasks, "-", "+", count=SCAN_CAP)
    pipe.xpending_range(jk.tasks, config.GROUP, "-", "+", SCAN_CAP)
    pipe.zrange(jk.retry, 0, SCAN_CAP - 1)
    results, errors, dlq, entries, pending, retry = pipe.execute(raise_on_error=False)
    in_stream: dict[int, tuple[str, Any]] = {}
    if isinstance(entries, list):
        for entry_id, f in entries:
            try:
                i = int(f[b"i"])
            except (KeyError, ValueError):
                continue
            in_stream[i] = (_s(entry_id), _decoded(f.get(b"t", b"b"), f.get(b"p", b"")))
    held: dict[str, dict[str, Any]] = {}
    if isinstance(pending, list):
        held = {_s(e["message_id"]): e for e in pending}
    retrying = _retries(retry)
    out = []
    for n, i in enumerate(idx):
        res = results[n] if isinstance(results, list) else None
        err = errors[n] if isinstance(errors, list) else None
        if res is not None:
            out.append(SubRequest(i, "done", None, result=Value.of(_result(res), limit)))
        elif err is not None:
            rec, attempts = _error(err)
            dl = dlq[n] if isinstance(dlq, list) else None
            out.append(SubRequest(
                i, "dead", attempts, error=Value.of(rec, limit),
                payload=Value.of(_decoded(dl[:1], dl[1:]), limit) if dl else None))
        elif i in retrying:
            attempts, payload = retrying[i]
            out.append(SubRequest(i, "retrying", attempts, payload=Value.of(payload, limit)))
        elif i in in_stream:
            entry_id, payload = in_stream[i]
            e = held.get(entry_id)
            if e is not None:
                out.append(SubRequest(i, "running", int(e["times_delivered"]),
                                      consumer=_s(e["consumer"]),
                                      idle_ms=int(e["time_since_delivered"]),
                                      payload=Value.of(payload, limit)))
            else:
                out.append(SubRequest(i, "queued", 0, payload=Value.of(payload, limit)))
        else:
            out.append(SubRequest(i, "cancelled" if cancelled else "unknown", None))
    return out


def _retries(members: Any) -> dict[int, tuple[int, Any]]:
    """index -> (attempts, decoded payload) of a job's retry set, whose members are
    ``<attempts>|<index>|<type>[,<context>]|<payload>`` (fail, add_entries)."""
    out: dict[int, tuple[int, Any]] = {}
    for member in members if isinstance(members, list) else []:
        parts = member.split(b"|", 3)
        if len(parts) == 4 and parts[1].isdigit():
            kind = parts[2].split(b",", 1)[0]
            out[int(parts[1])] = (int(parts[0] or 0), _decoded(kind, parts[3]))
    return out


def _small_subs(r: Client, qk: QueueKeys, st: JobStatus, rec: dict[str, Any], kept: Any,
                limit: int | None) -> tuple[list[SubRequest], int]:
    """A small job's one sub-request read where its lane keeps it, as
    :func:`sub_requests` reads a job's own stream: its result, its error and dead
    letter's payload, the entry a worker holds, its retry waiting or its queued entry.
    Also the retries waiting (0 or 1)."""
    pipe = r.pipeline(transaction=False)
    pipe.hget(qk.lresults, st.job_id)
    pipe.hmget(qk.lerrors, [st.job_id, f"{st.job_id}|p"])
    res, (err, held) = pipe.execute()
    res = (lane.result_of(kept) if kept is not None else None) or res
    if res is not None:
        return [SubRequest(0, "done", None, result=Value.of(_result(res), limit))], 0
    if err is not None:
        rec_err, attempts = _error(err)
        at = rec_err.get("at") if isinstance(rec_err, dict) else None
        # (its payload kept beside its error record; an older record's in the dead stream)
        dl = (held[:1], held[1:]) if held else _dead_payload(r, qk, st.job_id, at)
        return [SubRequest(0, "dead", attempts, error=Value.of(rec_err, limit),
                           payload=Value.of(_decoded(*dl), limit) if dl else None)], 0
    where = (int(rec["priority"]), str(rec["client"]))
    if st.in_flight:
        for h in lane_held.held(r, qk, [where], jobs={st.job_id}):
            return [SubRequest(0, "running", h.deliveries, consumer=h.consumer,
                               idle_ms=h.idle_ms,
                               payload=Value.of(_decoded(h.kind, h.payload), limit))], 0
    if st.queued:
        waits = lane_held.retrying(r, qk, [where], {st.job_id})
        if st.job_id in waits:
            attempts, kind, payload = waits[st.job_id]
            return [SubRequest(0, "retrying", attempts,
                               payload=Value.of(_decoded(kind, payload), limit))], 1
        got = lane_held.queued(r, qk, where, st.job_id, SCAN_CAP)
        return [SubRequest(0, "queued", 0,
                           payload=Value.of(_decoded(*got), limit) if got else None)], 0
    state = "cancelled" if st.state == JobState.CANCELLED else "unknown"
    return [SubRequest(0, state, None)], 0


def _dead_payload(r: Client, qk: QueueKeys, job_id: str, at: Any
                  ) -> tuple[bytes, bytes] | None:
    """(type, payload) of a small job's dead letter, written in the call that stored its
    error at ``at`` (ms): the first entry of ``dead`` from then naming the job."""
    if not isinstance(at, int | float):
        return None
    got: Any = r.xrange(qk.dead, int(at), "+", count=SCAN_CAP)
    me = job_id.encode()
    for _, f in got:
        if f.get(b"job") == me:
            return f.get(b"t", b"b"), f.get(b"p", b"")
    return None


def _by_state(st: JobStatus, retrying: int) -> dict[str, int]:
    """Sub-requests by state, from the job's counts; a cancelled job's that will not
    run are ``cancelled``."""
    out = {"done": st.done, "dead": st.failed, "running": st.in_flight,
           "queued": max(0, st.queued - retrying), "retrying": retrying}
    if st.state == JobState.CANCELLED:
        out["cancelled"] = max(0, st.total - st.done - st.failed - st.in_flight - st.queued)
    return out


def completion(r: Client, qk: QueueKeys, st: JobStatus) -> Completion | None:
    """The job's completion record in its shard's events stream (None: not complete,
    or trimmed)."""
    if st.finished_ms is None:
        return None
    got: Any = r.xrange(qk.events, st.finished_ms - 1000, st.finished_ms + 60_000, count=2000)
    for _, f in got:
        if f.get(b"job") == st.job_id.encode():
            return Completion(st.job_id, st.queue, JobState(_s(f[b"state"])), int(f[b"total"]),
                              int(f[b"done"]), int(f[b"failed"]), int(f[b"finished"]))
    return None


#: a job's settings in the Job view, in this order, each said in words
SHOWN = ("priority", "concurrency", "client", "max_deliveries", "dedup", "timeout",
         "retention", "due", "queue")


def _duration(ms: int) -> str:
    """``ms`` in the largest whole unit that fits: 1 day, 6 hours, 90 s, 250 ms."""
    for unit, size in (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000)):
        if ms >= size and ms % size == 0:
            n = ms // size
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms} ms"


def readable_settings(raw: dict[str, str]) -> dict[str, str]:
    """A job's stored settings (ms, epoch ms) as the Job view says them: durations in
    words with what they bound, times in UTC, a dedup key only when it has one."""
    out: dict[str, str] = {}
    for k in SHOWN:
        v = raw.get(k, "")
        if v == "":
            continue
        if k == "retention":
            v = f"{_duration(int(v))}: how long its records are kept after it ends"
        elif k == "timeout":
            v = f"{_duration(int(v))} per handler run on one sub-request"
        elif k == "due":
            v = datetime.fromtimestamp(int(v) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        out[{"max_deliveries": "max deliveries", "dedup": "dedup key"}.get(k, k)] = v
    return out


def detail(r: Client, shard: QueueKeys, small_shard: QueueKeys, st: JobStatus, offset: int,
           limit: int | None = PREVIEW_CHARS) -> JobDetail:
    """Everything the Job view shows of job ``st``."""
    jk = JobKeys(st.job_id, st.queue)
    meta: Any = r.hgetall(jk.meta)
    if not meta:  # a small job: one sub-request, its record in the lane's hash
        return _small_detail(r, small_shard, st, limit)
    m = {_s(k): _s(v) for k, v in meta.items()}
    retrying = int(r.zcard(jk.retry))
    subs = sub_requests(r, st.queue, st.job_id, st.total, offset, limit=limit,
                        cancelled=st.state == JobState.CANCELLED)
    settings = readable_settings(m)
    started = m.get("started")
    return JobDetail(st, False, int(started) if started else None, _by_state(st, retrying),
                     subs, offset, completion(r, shard, st), settings)


def _small_detail(r: Client, qk: QueueKeys, st: JobStatus, limit: int | None) -> JobDetail:
    """A small job's detail, shown as the same job on its own stream is. Its record
    has no first start (docs/design/job-life.md)."""
    kept = r.hget(qk.ljobs, st.job_id)
    rec = lane.parse(kept, qk.tag) if kept is not None else {}
    subs, retrying = (_small_subs(r, qk, st, rec, kept, limit) if rec else
                      ([SubRequest(0, "unknown", None)], 0))
    raw = {k: _s(v) for k, v in rec.items()}
    raw["concurrency"] = "1"  # one sub-request: one at a time
    if "retention" not in raw and st.finished_ms is not None:
        # a job that succeeded keeps a short record: its retention is where it is kept
        kept_ms = lane.retention_ms(r, qk, st.job_id, st.finished_ms,
                                    config.DEFAULT_RETENTION_S * 1000)
        raw["retention"] = "" if kept_ms is None else str(kept_ms)
    return JobDetail(st, True, None, _by_state(st, retrying), subs, 0,
                     completion(r, qk, st), readable_settings(raw))
