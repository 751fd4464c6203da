"""Retry in place (:meth:`streamq.Queue.retry`, ``streamq retry``): a failed or partial
job's dead-lettered sub-requests run again in the job they belong to, once each.

Each dead letter is replayed into its own job, under the markers ``dlq replay``
claims (:func:`streamq.producer.deadletters.replay`), so a dead letter runs again
once however retries and replays meet: whichever claims it first re-runs it, the
other is refused (a later ``dlq replay`` of it reports the job it went back to).

- A job on its own stream: its dead letters not yet in the dead stream (a worker died
  before it copied them) are copied first; they are claimed in the queue's hash slot,
  an intent is written there (so the reaper registers the job for a caller that
  dies midway), ``retry_job`` in the job's hash slot puts the claimed sub-requests
  back and reopens the job under a new incarnation (the retry's token: its next
  finish records one more completion), ``register_jobs`` gives it its tokens again,
  and the markers are completed and the dead-stream copies deleted.
- A small job: ``lane_retry`` does it all in the shard's slot, from the payload its
  error record keeps (so a dead letter purged or trimmed from the dead stream is
  retried as a job's own stream is); an error record kept before it named its dead
  letter has it found in the dead stream by the time it gives.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from streamq.base.keys import JobKeys, QueueKeys
from streamq.base.members import dead_letter_key
from streamq.base.replies import Call, JobReply, ScriptErrorCode, raise_for_code
from streamq.errors import ConfigError, JobNotFound
from streamq.model.queue_view import QueueStore
from streamq.model.scripts import Scripts
from streamq.producer.deadletters import REPLAY_CLAIM_MS, announce, marker_life_ms

NOT_FINISHED, NOTHING = ScriptErrorCode.NOT_FINISHED, ScriptErrorCode.NOTHING_TO_RETRY


class RetryHome(QueueStore, Protocol):
    """What a retry needs of its queue client: its store, and the queue-slot step of a
    submit (register a live job, give it its tokens, remove its intent)."""

    def register(self, jobs: Sequence[tuple[str, JobReply]], qk: QueueKeys | None = None
                 ) -> None: ...

#: how far from its error record's time a small job's dead letter is looked for, ms
_NEAR_MS = 2_000
#: dead-stream entries read per page while looking for one
_PAGE = 500


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _letters(q: QueueStore, jk: JobKeys, qk: QueueKeys, created: str
             ) -> list[tuple[int, str, str]]:
    """A job's dead letters that may run again: (index, identity, dead-stream entry id)
    of each sub-request in its ``dlq`` whose dead letter was announced."""
    r = q.redis
    errors: Any = r.hgetall(jk.errors)
    fields: Any = r.hkeys(jk.dlq)
    out = []
    for field in sorted(_text(f) for f in fields):
        rec = errors.get(field.encode())
        if not field.isdigit() or rec is None:
            continue
        serial = int(json.loads(rec).get("n") or 0)
        out.append((int(field), dead_letter_key(jk.job_id, int(created), field, serial)))
    if not out:
        return []
    pipe = r.pipeline(transaction=False)
    for _, letter in out:
        pipe.get(qk.announced(letter))
    return [(i, letter, _text(eid)) for (i, letter), eid in zip(out, pipe.execute())
            if eid is not None]


def _marks(qk: QueueKeys, letters: list[tuple[int, str, str]], token: str, life_ms: int,
           target: str) -> list[Call]:
    return [Scripts.replay_mark_call(qk, letter, eid, token, life_ms, target)
            for _, letter, eid in letters]


def retry_stream(q: RetryHome, qk: QueueKeys, job_id: str, token: str) -> int:
    """Retry a job on its own stream (see the module); how many sub-requests went back."""
    jk, r = qk.job(job_id), q.redis
    state, incarnation, created, retention = (
        None if v is None else _text(v)
        for v in r.hmget(jk.meta, "state", "incarnation", "created", "retention"))
    if state is None:
        raise JobNotFound(job_id)
    letters: list[tuple[int, str, str]] = []
    if incarnation != token:  # (a resend finds its own retry applied)
        if state not in ("failed", "partial"):
            raise_for_code("retry_job", int(NOT_FINISHED if state in ("open", "active") else NOTHING),
                           job_id)
        announce(q.scripts, qk, job_id)  # a dead letter a crash left unannounced, first
        found = _letters(q, jk, qk, created or "0")
        claims = q.scripts.run_many(_marks(qk, found, token, REPLAY_CLAIM_MS, ""))
        letters = [f for f, c in zip(found, claims) if int(c[0]) in (1, 2)]
        if not letters:
            raise_for_code("retry_job", int(NOTHING), job_id)
    q.scripts.run_many([q.scripts.intend_jobs_call(qk, [job_id])])
    # (a resend claims nothing: the script finds the job under its token and replies as
    # the first call did, whatever index it is given)
    moved, reply = q.scripts.retry_job(jk, token, [i for i, _, _ in letters] or [0])
    q.register([(job_id, reply._replace(dedup="", due_ms=0))], qk)
    if letters:
        q.scripts.run_many(_marks(qk, letters, token, marker_life_ms(int(retention or 0)),
                                  job_id))
        r.xdel(qk.dead, *[eid for _, _, eid in letters])
    return moved


def retry_lane(q: RetryHome, qk: QueueKeys, job_id: str, rec: dict[str, Any], raw: str,
               token: str) -> int:
    """Retry a failed small job (its record ``rec``, read as ``raw``); 1 (its one
    sub-request went back, by this call or by this token's before)."""
    r = q.redis
    if f'"retry":"{token}",' in raw:
        return 1  # this retry's, sent again (its job may have ended since)
    if rec["state"] == "active":
        raise_for_code("lane_retry", int(NOT_FINISHED), job_id)
    if rec["state"] != "failed":
        raise_for_code("lane_retry", int(NOTHING), job_id)
    err: Any = r.hget(qk.lerrors, job_id)
    error = json.loads(err) if err else {}
    at, serial = int(error.get("at", 0)), int(error.get("n", 1))
    # (the error record names its dead letter's entry, whose payload it keeps: the
    # dead letter may since have left the dead stream; one kept before it named it
    # is looked for there)
    dead_id = error.get("d") or _dead_entry(q, qk, job_id, at, serial)
    if dead_id is None:
        raise ConfigError(f"job {job_id!r} has nothing to retry: its dead letter is gone "
                          "(replayed or purged)")
    letter = dead_letter_key(job_id, int(rec.get("created") or 0), "0", serial)
    q.scripts.lane_retry(qk, (int(rec["priority"]), str(rec["client"])), job_id, dead_id,
                         letter, token, marker_life_ms(int(rec.get("retention") or 0)))
    return 1


def _dead_entry(q: RetryHome, qk: QueueKeys, job_id: str, at_ms: int, serial: int
                ) -> str | None:
    """The dead-stream entry of a small job's dead letter of serial ``serial``, written
    at ``at_ms`` (Redis's clock), or None."""
    start, end = f"{max(0, at_ms - _NEAR_MS)}-0", f"{at_ms + _NEAR_MS}-18446744073709551615"
    while True:
        page: Any = q.redis.xrange(qk.dead, start, end, count=_PAGE)
        for eid, f in page:
            if (f.get(b"job") == job_id.encode() and f.get(b"index") == b"0"
                    and f.get(b"n") == str(serial).encode()):
                return _text(eid)
        if len(page) < _PAGE:
            return None
        start = "(" + _text(page[-1][0])
