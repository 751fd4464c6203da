"""The dead-letter store: list, show, replay and purge dead-lettered sub-requests.

A dead letter lives in its job's hash slot (``errors``: the error record,
``dlq``: the payload) and is announced, once, in the queue's ``dead`` stream,
which carries a copy of the payload so it can be replayed after the job is
gone. Each dead letter is replayed once.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from streamq.base.codec import decode
from streamq.base.config import (
    ANNOUNCE_CHUNK,
    DEFAULT_DEAD_MAXLEN,
    DEFAULT_RETENTION_S,
    UNANNOUNCED_GRACE_MS,
)
from streamq.base.failures import split_failure
from streamq.base.keys import QueueKeys
from streamq.base.members import dead_letter_key
from streamq.errors import DeadLetterReplayed, JobNotFound, ScriptError, StreamqError
from streamq.model.scripts import ScriptErrorCode, Scripts
from streamq.storage.connection import Client


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
    #: serial of the dead letter in its job (0 for one announced before serials existed)
    serial: int = 0
    #: creation time of its job, ms (0 when announced before it was recorded)
    job_created_ms: int = 0
    #: the handler's traceback as the worker recorded it ("" when none was: a timeout,
    #: a malformed entry); ``error`` is the summary line above it
    traceback: str = ""

    @property
    def key(self) -> str:
        """The dead letter's identity, shared by every copy of it in the dead stream."""
        return dead_letter_key(self.job_id, self.job_created_ms, self.index, self.serial)

    def as_dict(self) -> dict[str, Any]:
        try:
            value: Any = decode(self.kind, self.payload)
            if isinstance(value, bytes):
                value = value.decode("utf-8", "backslashreplace")
        except StreamqError:
            value = self.payload.decode("utf-8", "backslashreplace")
        # a sub-request's index is a number; a malformed entry's is "entry:<id>"
        index: int | str = int(self.index) if self.index.isdigit() else self.index
        return {"id": self.id, "job_id": self.job_id, "index": index, "error": self.error,
                "traceback": self.traceback,
                "attempts": self.attempts, "at_ms": self.at_ms, "serial": self.serial,
                "payload": value}


#: How long an unfinished replay claim blocks other callers, in milliseconds.
REPLAY_CLAIM_MS = 60_000


class Announced(NamedTuple):
    """What one :func:`announce` did."""

    added: int  #: dead letters added to the dead stream by this call
    left: int  #: dead letters of the job still waiting for their announcement
    terminal: bool  #: the job is terminal or gone (no new dead letter can come)


def marker_life_ms(retention_ms: int) -> int:
    """Lifetime of a dead letter's announce and replay markers: longer than any record
    of it in its job's hash slot (``unannounced`` lives the retention + the grace)."""
    return max(retention_ms, 0) + UNANNOUNCED_GRACE_MS


def announce(scripts: Scripts, qk: QueueKeys, job_id: str,
             maxlen: int = DEFAULT_DEAD_MAXLEN) -> Announced:
    """Copy a job's not yet announced dead letters to the queue's dead stream, once each.

    A durable two-step across the job and queue slots: the dead letter waits in the
    job's ``unannounced`` set (step one, written with the dead letter); ``announce``
    copies it under a marker named after the job, its field and its serial (a resent
    or concurrent copy adds nothing), then removes it from the set if it is still the
    same dead letter. Whoever calls it (worker, reaper) may crash anywhere: the set
    and the queue's ``owed`` set let the reaper finish the work.
    """
    jk = qk.job(job_id)
    added, left, terminal = 0, 0, False
    for _ in range(1000):  # bounded: each round lists ANNOUNCE_CHUNK of them
        job, letters = scripts.unannounced(jk, ANNOUNCE_CHUNK)
        terminal = job.state not in ("open", "active")
        if not letters:
            return Announced(added, 0, terminal)
        life = marker_life_ms(job.retention_ms)
        calls, done = [], []
        for field, err_raw, stored in letters:
            rec: dict[str, Any] = json.loads(err_raw)
            serial = int(rec.get("n") or 0)
            calls.append(scripts.announce_call(
                qk, dead_letter_key(job_id, job.created_ms, field, serial), life, maxlen,
                (job_id, field, str(rec.get("error", "")), int(rec.get("attempts") or 0),
                 int(rec.get("at") or 0), stored[:1] or b"b", stored[1:], serial,
                 job.created_ms)))
            done.append((field, serial))
        added += sum(int(r[0]) for r in scripts.run_many(calls))
        left = scripts.announced(jk, done)
        if left == 0 or len(letters) < ANNOUNCE_CHUNK:
            break
    return Announced(added, left, terminal)


def _parse(entry_id: bytes, f: dict[bytes, bytes]) -> DeadLetter:
    error, trace = split_failure(f[b"error"].decode("utf-8", "replace"))
    return DeadLetter(entry_id.decode(), f[b"job"].decode(), f[b"index"].decode(),
                      error, int(f[b"attempts"]), int(f[b"at"]),
                      f.get(b"t", b"b"), f.get(b"p", b""), int(f.get(b"n", b"0")),
                      int(f.get(b"c", b"0")), trace)


def list_dead(client: Client, qk: QueueKeys, count: int = 100,
              job_id: str | None = None) -> list[DeadLetter]:
    """The newest dead letters (one per dead letter: a copy announced by an older
    version is hidden), newest first."""
    out: list[DeadLetter] = []
    seen: set[str] = set()
    raw: Any = client.xrevrange(qk.dead, count=count * 2 if job_id is None else 10_000)
    for entry_id, f in raw:
        d = _parse(entry_id, f)
        if (job_id is None or d.job_id == job_id) and d.key not in seen:
            seen.add(d.key)
            out.append(d)
            if len(out) >= count:
                break
    return out


def get_dead(client: Client, qk: QueueKeys, dead_id: str) -> DeadLetter:
    """One dead letter by its id in the dead stream; raises JobNotFound-like StreamqError."""
    raw: Any = client.xrange(qk.dead, dead_id, dead_id)
    if not raw:
        raise StreamqError(f"no dead letter {dead_id!r} in queue {qk.name!r}")
    return _parse(*raw[0])


def replay(client: Client, scripts: Scripts, qk: QueueKeys, dead: DeadLetter,
           new_job: Callable[[bytes, bytes, str], str], token: str | None = None) -> str:
    """Put a dead letter back to work, once; return the job id it went to.

    Into its own job while that job is unfinished; otherwise (finished or
    gone) into a new job made by ``new_job(kind, payload, job_id)``, whose id is
    derived from the dead letter, so a retried call makes no second job.
    The first replay of a dead letter marks it (``replay_mark``, under a
    ``token`` the caller keeps across its retries); any other replay of it, or
    of a copy of it, raises :class:`DeadLetterReplayed`. The dead letter leaves
    the dead stream.

    The claim lasts ``REPLAY_CLAIM_MS`` until the replay is done: a caller that
    died meanwhile does not block the dead letter for longer, and the replay
    itself is idempotent (the job-slot ``replay`` acts on that dead letter's
    serial only; a new job's id is :func:`replay_job_id`), so a second caller
    taking over a stale claim runs nothing twice.
    """
    token = token or uuid.uuid4().hex
    life = marker_life_ms(_retention_ms(client, qk, dead.job_id))
    claim, target = scripts.replay_mark(qk, dead.key, dead.id, token, REPLAY_CLAIM_MS)
    if claim == 0:
        if target:
            client.xdel(qk.dead, dead.id)  # a copy of a dead letter replayed before
        raise DeadLetterReplayed(dead.id, target)
    if not target:
        target = _replay_once(client, scripts, qk, dead, new_job)
        scripts.replay_mark(qk, dead.key, dead.id, token, life, target)
    client.xdel(qk.dead, dead.id)
    return target


def _replay_once(client: Client, scripts: Scripts, qk: QueueKeys, dead: DeadLetter,
                 new_job: Callable[[bytes, bytes, str], str]) -> str:
    """The replay itself, safe to run again for the same dead letter."""
    try:
        if not dead.index.isdigit():
            raise ScriptError("replay", int(ScriptErrorCode.JOB_FINISHED), "malformed entry")
        scripts.replay(qk.job(dead.job_id), int(dead.index), dead.serial, dead.job_created_ms)
    except (ScriptError, JobNotFound) as e:
        code = getattr(e, "code", ScriptErrorCode.JOB_NOT_FOUND)
        if code == ScriptErrorCode.NOT_DEAD:
            return dead.job_id  # this replay put it back before its reply was lost
        if code in (ScriptErrorCode.JOB_FINISHED, ScriptErrorCode.JOB_NOT_FOUND):
            return new_job(dead.kind, dead.payload, replay_job_id(dead))
        raise
    concurrency: Any = client.hget(qk.job(dead.job_id).meta, "concurrency")
    scripts.unpark(qk, dead.job_id, int(concurrency or 1))
    return dead.job_id


def replay_job_id(dead: DeadLetter) -> str:
    """Id of the job a dead letter is replayed into when its own job is finished or gone:
    derived from the dead letter, so every attempt of one replay names one job."""
    return "replay-" + hashlib.sha256(dead.key.encode()).hexdigest()[:32]


def _retention_ms(client: Client, qk: QueueKeys, job_id: str) -> int:
    """The retention of a dead letter's job: a job's meta's, a small job's record's (its
    markers must outlive the record a retry in place reads), else the default."""
    raw: Any = client.hget(qk.job(job_id).meta, "retention")
    if raw:
        return int(raw)
    rec: Any = client.hget(qk.ljobs, job_id)  # (a small job: its shard is the dead letter's)
    if rec and rec[:1] == b"{":
        retention = json.loads(rec).get("retention")
        if isinstance(retention, int):
            return retention
    return DEFAULT_RETENTION_S * 1000


def replayed_into(client: Client, qk: QueueKeys, dead_id: str) -> str | None:
    """The job a dead-stream entry was replayed into ("" when unknown), or None if it was
    not replayed (as far as the markers remember)."""
    raw: Any = client.get(qk.replayed_entry(dead_id))
    if raw is None:
        return None
    return str(raw.decode().partition("|")[2])


def purge(client: Client, qk: QueueKeys) -> int:
    """Delete every dead letter of the queue's dead stream; return how many."""
    n = int(client.xlen(qk.dead))
    client.delete(qk.dead)
    return n
