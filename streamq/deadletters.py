"""The dead-letter store: list, show, replay and purge dead-lettered sub-requests.

A dead letter lives in its job's slot (``errors``: the error record,
``dlq``: the payload) and is announced in the queue's ``dead`` stream, which
carries a copy of the payload so it can be replayed after the job is gone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from .codec import decode
from .config import DEFAULT_DEAD_MAXLEN
from .errors import JobNotFound, ScriptError, StreamqError
from .keys import JobKeys, QueueKeys
from .scripts import ScriptErrorCode, Scripts


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered sub-request, as the queue's dead stream records it."""

    id: str  #: id in the queue's dead stream
    job_id: str
    index: str  #: sub-request index, or "entry:<id>" for a malformed entry
    error: str
    attempts: int
    at_ms: int
    kind: bytes
    payload: bytes

    def as_dict(self) -> dict[str, Any]:
        try:
            value: Any = decode(self.kind, self.payload)
            if isinstance(value, bytes):
                value = value.decode("utf-8", "backslashreplace")
        except StreamqError:
            value = self.payload.decode("utf-8", "backslashreplace")
        return {"id": self.id, "job_id": self.job_id, "index": self.index, "error": self.error,
                "attempts": self.attempts, "at_ms": self.at_ms, "payload": value}


def announce(client: redis.Redis, qk: QueueKeys, job_id: str,
             maxlen: int = DEFAULT_DEAD_MAXLEN) -> int:
    """Copy a job's not yet announced dead letters to the queue's dead stream.

    At least once: each is added, then removed from the job's ``unannounced``
    set, so a crash in between announces it again rather than never.
    """
    jk = JobKeys(job_id)
    fields: list[bytes] = list(client.smembers(jk.unannounced))  # type: ignore[arg-type]
    if not fields:
        return 0
    pipe = client.pipeline(transaction=False)
    for f in fields:
        pipe.hget(jk.errors, f)
        pipe.hget(jk.dlq, f)
    got = pipe.execute()
    for n, f in enumerate(fields):
        err_raw, stored = got[2 * n], got[2 * n + 1]
        rec: dict[str, Any] = (json.loads(err_raw) if err_raw
                               else {"error": "unknown", "attempts": 0, "at": 0})
        stored = stored or b"b"
        pipe.xadd(qk.dead, {"job": job_id, "index": f, "error": str(rec.get("error", "")),
                            "attempts": int(rec.get("attempts") or 0), "at": int(rec.get("at") or 0),
                            "t": stored[:1], "p": stored[1:]},
                  maxlen=maxlen, approximate=True)
        pipe.srem(jk.unannounced, f)
    pipe.execute()
    return len(fields)


def _parse(entry_id: bytes, f: dict[bytes, bytes]) -> DeadLetter:
    return DeadLetter(entry_id.decode(), f[b"job"].decode(), f[b"index"].decode(),
                      f[b"error"].decode("utf-8", "replace"), int(f[b"attempts"]), int(f[b"at"]),
                      f.get(b"t", b"b"), f.get(b"p", b""))


def list_dead(client: redis.Redis, qk: QueueKeys, count: int = 100,
              job_id: str | None = None) -> list[DeadLetter]:
    """The newest dead letters (one per job and index), newest first."""
    out: list[DeadLetter] = []
    seen: set[tuple[str, str]] = set()
    raw: Any = client.xrevrange(qk.dead, count=count * 2 if job_id is None else 10_000)
    for entry_id, f in raw:
        d = _parse(entry_id, f)
        if (job_id is None or d.job_id == job_id) and (d.job_id, d.index) not in seen:
            seen.add((d.job_id, d.index))
            out.append(d)
            if len(out) >= count:
                break
    return out


def get_dead(client: redis.Redis, qk: QueueKeys, dead_id: str) -> DeadLetter:
    """One dead letter by its id in the dead stream; raises JobNotFound-like StreamqError."""
    raw: Any = client.xrange(qk.dead, dead_id, dead_id)
    if not raw:
        raise StreamqError(f"no dead letter {dead_id!r} in queue {qk.name!r}")
    return _parse(*raw[0])


def replay(client: redis.Redis, scripts: Scripts, qk: QueueKeys, dead: DeadLetter,
           new_job: Any = None) -> str:
    """Put a dead letter back to work; return the job id it went to.

    Into its own job while that job is unfinished; otherwise (finished or
    gone) into a new job made by ``new_job(kind, payload) -> job id``.
    The dead letter leaves the dead stream either way.
    """
    target = dead.job_id
    try:
        if not dead.index.isdigit():
            raise ScriptError("replay", int(ScriptErrorCode.JOB_FINISHED), "malformed entry")
        scripts.replay(JobKeys(dead.job_id), int(dead.index))
        concurrency = client.hget(JobKeys(dead.job_id).meta, "concurrency")
        scripts.unpark(qk, dead.job_id, int(concurrency or 1))
    except (ScriptError, JobNotFound) as e:
        code = getattr(e, "code", ScriptErrorCode.JOB_NOT_FOUND)
        if code == ScriptErrorCode.NOT_DEAD:
            pass  # replayed already: it is back in its job
        elif code in (ScriptErrorCode.JOB_FINISHED, ScriptErrorCode.JOB_NOT_FOUND) and new_job:
            target = new_job(dead.kind, dead.payload)
        else:
            raise
    client.xdel(qk.dead, dead.id)
    return target


def purge(client: redis.Redis, qk: QueueKeys) -> int:
    """Delete every dead letter of the queue's dead stream; return how many."""
    n = int(client.xlen(qk.dead))
    client.delete(qk.dead)
    return n
