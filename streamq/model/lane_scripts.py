"""The scripts of the small-job lane (:mod:`streamq.lane`): one typed method each.

Every lane script runs in one queue shard's slot: the lane streams, the small
jobs' records, results and errors, the events and the dead letters all carry
the shard's hash tag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from streamq.base.config import DEFAULT_DEAD_MAXLEN, GROUP, WAKE_CAP
from streamq.base.keys import QueueKeys
from streamq.base.members import lane_member
from streamq.base.replies import Call, raise_for_code
from streamq.model.script_base import ScriptsBase
from streamq.services import tracing


class QueueSettings(Protocol):
    """A queue's name and the settings its completions are written with (what
    :meth:`LaneCtx.of` reads of a queue client)."""

    @property
    def name(self) -> str: ...
    @property
    def retention_ms(self) -> int: ...
    @property
    def events_maxlen(self) -> int: ...


@dataclass(frozen=True)
class LaneCtx:
    """What every lane script that completes jobs is told: where completions go."""

    queue: str
    events_maxlen: int
    events_retention_ms: int
    dead_maxlen: int = DEFAULT_DEAD_MAXLEN

    @classmethod
    def of(cls, q: QueueSettings) -> LaneCtx:
        """The settings of queue client ``q`` (its retention and events cap)."""
        return cls(queue=q.name, events_maxlen=q.events_maxlen,
                   events_retention_ms=q.retention_ms)

    def args(self, qk: QueueKeys) -> list[Any]:
        """The head of the call's arguments (channels, the queue's name and the
        publish command are the function's own, from the keys' tag)."""
        return [GROUP, self.events_maxlen, self.events_retention_ms]


class LaneScripts(ScriptsBase):
    """Lane scripts (keys of :class:`streamq.keys.QueueKeys`)."""

    @staticmethod
    def lane_submit_call(qk: QueueKeys, priority: int, client: str, retention_ms: int,
                         max_deliveries: int, jobs: Sequence[tuple[str, bytes, bytes]]) -> Call:
        """Submit small jobs into one lane: (job id, type, payload) each, every one with
        ``retention_ms`` and ``max_deliveries`` (the function makes their records); the
        reply is Redis's clock, then 1 per job submitted now, 0 per job recorded before.
        See lane_submit-5.lua."""
        args: list[Any] = [GROUP, lane_member(priority, client), WAKE_CAP, retention_ms,
                           max_deliveries]
        for job, kind, payload in jobs:
            args += [job, kind, payload]
        if tracing.ACTIVE and (trace := tracing.entry_context()):
            args.append(trace)
        return Call("lane_submit",
                    (qk.lane(priority, client), qk.lanes, qk.ljobs, qk.lactive, qk.wake), args)

    @staticmethod
    def lane_ack_call(qk: QueueKeys, stream: str, ctx: LaneCtx,
                      done: Sequence[tuple[str, str, bytes]]) -> Call:
        """Acknowledge and complete small jobs of one lane stream: (entry id, job id,
        encoded result) each; replies {acknowledged, completed}. See lane_ack-9.lua."""
        args = ctx.args(qk)
        for eid, job, result in done:
            args += [eid, job, result]
        return Call("lane_ack", (stream, qk.ljobs, qk.lresults, qk.lerrors, qk.lstarts,
                                 qk.lactive, qk.ldone, qk.events, qk.lkept), args)

    @staticmethod
    def lane_fail_call(qk: QueueKeys, lane: tuple[int, str], ctx: LaneCtx, *, entry_id: str,
                       job: str, attempts: int, delay_ms: int, error: str, kind: bytes,
                       payload: bytes, trace: str = "") -> Call:
        """Report a failed attempt of a small job: a retry after ``delay_ms`` (-1: dead
        letter now); replies 0 settled already, 1 retry, 2 dead-lettered. ``trace``: the
        entry's trace context, which its retry carries. See lane_fail-11.lua."""
        prio, client = lane
        args = [*ctx.args(qk), ctx.dead_maxlen, lane_member(prio, client), entry_id, job,
                attempts, delay_ms, error, kind, payload]
        if trace:
            args.append(trace)
        return Call("lane_fail",
                    (qk.lane(prio, client), qk.lane_retry(prio, client), qk.ljobs, qk.lerrors,
                     qk.lstarts, qk.lactive, qk.ldone, qk.events, qk.dead, qk.retries, qk.lkept),
                    args)

    @staticmethod
    def lane_promote_call(qk: QueueKeys, lane: tuple[int, str], limit: int = 1000) -> Call:
        """Move a lane's due retries back into its stream; replies {moved, ms until the
        next is due or -1}. See lane_promote-5.lua."""
        prio, client = lane
        return Call("lane_promote",
                    (qk.lane_retry(prio, client), qk.lane(prio, client), qk.retries, qk.wake,
                     qk.lanes),
                    (limit, lane_member(prio, client), WAKE_CAP, GROUP))

    def lane_drop(self, qk: QueueKeys, lane: tuple[int, str]) -> bool:
        """Drop a lane with no entry and no retry (stream, group, registry entry); False
        when it has work. See lane_drop-3.lua."""
        prio, client = lane
        return bool(self.run("lane_drop", (qk.lane(prio, client), qk.lane_retry(prio, client),
                                           qk.lanes),
                             (GROUP, lane_member(prio, client))))

    def lane_reclaim(self, qk: QueueKeys, lane: tuple[int, str], ctx: LaneCtx, *,
                     consumer: str, min_idle_ms: int, cursor: str, count: int,
                     max_deliveries: int = 0) -> tuple[str, int, int, int]:
        """One XAUTOCLAIM slice of a lane's stalled entries; (next cursor, re-added,
        dead-lettered, jobs those completed). Also forgets finished jobs past their
        retention. See lane_reclaim-10.lua."""
        prio, client = lane
        r = self.run("lane_reclaim",
                     (qk.lane(prio, client), qk.ljobs, qk.lerrors, qk.lstarts, qk.lactive,
                      qk.ldone, qk.events, qk.dead, qk.lresults, qk.lkept),
                     [*ctx.args(qk), ctx.dead_maxlen, consumer, min_idle_ms, cursor, count,
                      max_deliveries])
        nxt = r[0].decode() if isinstance(r[0], bytes) else str(r[0])
        return nxt, int(r[1]), int(r[2]), int(r[3])

    def lane_delete(self, qk: QueueKeys, lane: tuple[int, str], job: str) -> None:
        """Delete a finished small job's records now; JobNotFound for no record,
        ConfigError for one not finished; an entry of it a worker still holds is
        acknowledged and deleted. See lane_delete-5.lua."""
        prio, client = lane
        r = self.run("lane_delete", (qk.lane(prio, client), qk.ljobs, qk.lresults, qk.lerrors,
                                     qk.ldone), (GROUP, lane_member(prio, client), job))
        raise_for_code("lane_delete", r, job)

    def lane_retry(self, qk: QueueKeys, lane: tuple[int, str], job: str, dead_id: str,
                   letter: str, token: str, life_ms: int) -> bool:
        """Re-run failed small job ``job`` in place from its dead letter (``dead_id`` in
        the dead stream, identity ``letter``), under ``token``; False when this token
        did it before. See lane_retry-10.lua."""
        prio, client = lane
        r = self.run("lane_retry",
                     (qk.lane(prio, client), qk.lanes, qk.ljobs, qk.lerrors, qk.lactive,
                      qk.ldone, qk.dead, qk.wake, qk.replayed(letter),
                      qk.replayed_entry(dead_id)),
                     (GROUP, lane_member(prio, client), WAKE_CAP, job, dead_id, token, life_ms))
        raise_for_code("lane_retry", r, job)
        return int(r) == 1

    def lane_cancel(self, qk: QueueKeys, lane: tuple[int, str], ctx: LaneCtx, job: str,
                    closer: str = "") -> tuple[bool | None, str]:
        """Cancel a small job whose record names ``lane``: (whether this call cancelled
        it, the id of its entry a worker holds or ""); (None, "") when its record names
        another lane (it moved meanwhile: read it again). ``closer`` names the call:
        sent again after a lost reply, it replies as the call that cancelled.
        JobNotFound-coded reply for no record. See lane_cancel-7.lua."""
        prio, client = lane
        r = self.run("lane_cancel",
                     (qk.lane(prio, client), qk.lane_retry(prio, client), qk.ljobs, qk.lactive,
                      qk.ldone, qk.events, qk.lkept),
                     [*ctx.args(qk), job, closer])
        raise_for_code("lane_cancel", r, job)
        if int(r[0]) == 2:
            return None, ""
        held = r[1].decode() if isinstance(r[1], bytes) else str(r[1])
        return bool(int(r[0])), held

    def lane_reprioritize(self, qk: QueueKeys, lane: tuple[int, str], priority: int,
                          job: str) -> int:
        """Move small job ``job``, whose record names ``lane`` (priority, client), to the
        lane of ``priority``: 1 changed, 0 at that priority already, 2 a worker holds its
        entry (nothing changed), 3 its record names another lane (read it again).
        JobNotFound, or ScriptError JOB_FINISHED for a job that ended. See
        lane_reprioritize-8.lua."""
        prio, client = lane
        r = self.run("lane_reprioritize",
                     (qk.lane(prio, client), qk.lane_retry(prio, client),
                      qk.lane(priority, client), qk.lane_retry(priority, client), qk.lanes,
                      qk.ljobs, qk.retries, qk.wake),
                     (GROUP, lane_member(prio, client), lane_member(priority, client), job,
                      WAKE_CAP))
        raise_for_code("lane_reprioritize", r, job)
        return int(r)

    def lane_start(self, qk: QueueKeys, stream: str, entry_id: str, consumer: str) -> bool:
        """Record the start of a suspect lane entry; False when it was settled already.
        See lane_start-2.lua."""
        return bool(self.run("lane_start", (stream, qk.lstarts), (entry_id, consumer)))
