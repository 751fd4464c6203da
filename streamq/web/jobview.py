"""The Job view's reads: a job's status, its sub-requests by state, results, errors,
dead letters and completion record.

Sub-requests are shown a page of indexes at a time. A sub-request's state comes from
where it is now: a result in ``results`` (done), an error record in ``errors`` (dead
letter), a member of ``retry`` (waiting for its next attempt), an entry in the stream
pending in the group (running) or not yet delivered (queued). Each read is bounded
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
from streamq.producer import lane
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
                 limit: int | None = PREVIEW_CHARS) -> list[SubRequest]:
    """Sub-requests ``offset`` .. ``offset + count - 1`` of a (big) job."""
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
    retrying: dict[int, tuple[int, Any]] = {}
    if isinstance(retry, list):
        for member in retry:
            parts = member.split(b"|", 2)
            if len(parts) == 3 and parts[1].isdigit():
                payload = parts[2]
                retrying[int(parts[1])] = (int(parts[0] or 0),
                                           _decoded(payload[:1], payload[1:]))
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
            out.append(SubRequest(i, "unknown", None))
    return out


def _small_subs(r: Client, qk: QueueKeys, st: JobStatus, rec: dict[str, Any],
                limit: int | None) -> list[SubRequest]:
    pipe = r.pipeline(transaction=False)
    pipe.hget(qk.ljobs, st.job_id)
    pipe.hget(qk.lresults, st.job_id)
    pipe.hget(qk.lerrors, st.job_id)
    kept, res, err = pipe.execute()
    res = (lane.result_of(kept) if kept is not None else None) or res
    if res is not None:
        return [SubRequest(0, "done", None, result=Value.of(_result(res), limit))]
    if err is not None:
        rec_err, attempts = _error(err)
        return [SubRequest(0, "dead", attempts, error=Value.of(rec_err, limit))]
    state = "running" if st.in_flight else "queued" if st.queued else (
        "cancelled" if st.state == JobState.CANCELLED else "unknown")
    return [SubRequest(0, state, None)]


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
        raw = r.hget(small_shard.ljobs, st.job_id)
        rec = lane.parse(raw, small_shard.tag) if raw is not None else {}
        subs = _small_subs(r, small_shard, st, rec, limit)
        settings = readable_settings({k: _s(v) for k, v in rec.items()})
        return JobDetail(st, True, None, _count(subs), subs, 0,
                         completion(r, small_shard, st), settings)
    m = {_s(k): _s(v) for k, v in meta.items()}
    retrying = int(r.zcard(jk.retry))
    by_state = {"done": st.done, "dead": st.failed, "running": st.in_flight,
                "queued": max(0, st.queued - retrying), "retrying": retrying}
    subs = sub_requests(r, st.queue, st.job_id, st.total, offset, limit=limit)
    settings = readable_settings(m)
    started = m.get("started")
    return JobDetail(st, False, int(started) if started else None, by_state, subs, offset,
                     completion(r, shard, st), settings)


def _count(subs: list[SubRequest]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in subs:
        out[s.state] = out.get(s.state, 0) + 1
    return out
