"""The scripts of dead letters: replay, announce, and their bookkeeping."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from streamq.base.keys import JobKeys, QueueKeys
from streamq.base.replies import Call, JobMeta, raise_for_code, s
from streamq.model.script_base import ScriptsBase


class DeadLetterScripts(ScriptsBase):
    """Dead-letter scripts (job's hash slot and queue's hash slot)."""

    def replay(self, jk: JobKeys, index: int, serial: int, created_ms: int = 0) -> None:
        """Put dead letter ``serial`` back into its unfinished job, the one created at
        ``created_ms`` (0: any); raises on error codes."""
        reply = self.run("replay", (jk.meta, jk.tasks, jk.errors, jk.dlq, jk.unannounced),
                         (index, serial, created_ms or ""))
        raise_for_code("replay", reply, jk.job_id)

    def replay_mark(self, qk: QueueKeys, letter: str, entry_id: str, token: str,
                    life_ms: int, target: str = "") -> tuple[int, str]:
        """Claim (``target`` "") or complete the one replay of dead letter ``letter``;
        return (2 claimed now | 1 this token's | 0 another caller's, target job)."""
        call = self.replay_mark_call(qk, letter, entry_id, token, life_ms, target)
        r = self.run(call.name, call.keys, call.args)
        return int(r[0]), s(r[1])

    @staticmethod
    def replay_mark_call(qk: QueueKeys, letter: str, entry_id: str, token: str,
                         life_ms: int, target: str = "") -> Call:
        """The call of :meth:`replay_mark`, for a batch of them."""
        return Call("replay_mark", (qk.replayed(letter), qk.replayed_entry(entry_id)),
                    (token, life_ms, target))

    def unannounced(self, jk: JobKeys, limit: int) -> tuple[JobMeta, list[tuple[str, bytes,
                                                                                bytes]]]:
        """A job's dead letters not yet announced: (the job, [(field, error record JSON,
        type letter + payload)])."""
        r = self.run("unannounced", (jk.unannounced, jk.errors, jk.dlq, jk.meta), (limit,))
        return JobMeta(s(r[0]), int(r[1]), int(r[2])), [(s(r[i]), r[i + 1], r[i + 2])
                                                          for i in range(3, len(r), 3)]

    @staticmethod
    def announce_call(qk: QueueKeys, letter: str, life_ms: int, maxlen: int,
                      fields: Sequence[Any]) -> Call:
        """Copy one dead letter to the dead stream once (``fields``: job, field, error,
        attempts, at ms, type letter, payload, serial, job created ms); replies
        {added 1|0, entry id}."""
        return Call("announce", (qk.dead, qk.announced(letter)), (maxlen, life_ms, *fields))

    def announced(self, jk: JobKeys, letters: Sequence[tuple[str, int]]) -> int:
        """Drop announced dead letters (field, serial) from ``unannounced``; return how
        many still wait."""
        args: list[Any] = list(itertools.chain.from_iterable(letters))
        return int(self.run("announced", (jk.unannounced, jk.errors), args))

    def clear_owed(self, qk: QueueKeys, job_id: str, score: float | None = None) -> bool:
        """Remove a job from ``owed`` (only with this score, when given)."""
        return bool(self.run("clear_owed", (qk.owed,),
                             (job_id, "" if score is None else repr(score))))
