"""The scripts of a queue's hash slot: register, settle, finish, heartbeat, reap, trim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamq.base.config import MAX_CONCURRENCY, STATS_WINDOW_MS, WAKE_CAP
from streamq.base.keys import QueueKeys
from streamq.base.members import owner
from streamq.base.replies import Call, JobReply, SettleReply, s
from streamq.model.script_base import ScriptsBase


class QueueScripts(ScriptsBase):
    """Queue-slot scripts (keys of :class:`streamq.keys.QueueKeys`)."""


    @staticmethod
    def register_jobs_call(qk: QueueKeys, jobs: Sequence[tuple[str, JobReply]]) -> Call:
        """Register jobs (id and the job's own settings; a scheduled job parked until
        it is due); see register_jobs-9.lua."""
        args: list[Any] = [WAKE_CAP]
        for job_id, job in jobs:
            args += [job_id, job.priority, job.client, job.concurrency, job.incarnation,
                     job.dedup, job.due_ms]
        return Call("register_jobs",
                    (qk.active, qk.finished, qk.tokens, qk.ready, qk.fair, qk.wake, qk.creating,
                     qk.parked, qk.retries), args)

    @staticmethod
    def intend_jobs_call(qk: QueueKeys, intents: Sequence[str]) -> Call:
        """Record intents (:func:`streamq.members.intent`) ahead of their job-slot creates;
        see intend_jobs-1.lua."""
        return Call("intend_jobs", (qk.creating,), list(intents))

    def drop_intent(self, qk: QueueKeys, job_id: str, dedup: str, written_ms: int) -> tuple[bool, bool]:
        """Drop the intent of a job whose create never ran, releasing its dedup key while
        that still names the job; return (dropped, released). See drop_intent-3.lua."""
        r = self.run("drop_intent", (qk.creating, qk.dedup, qk.dedup_expiry),
                     (job_id, dedup, written_ms))
        return r[0] == 1, r[1] == 1

    @staticmethod
    def settle_call(
        qk: QueueKeys,
        worker: str,
        slot: int,
        seq: str | int,
        lease_ms: int,
        claim: int,
        settled: Sequence[tuple[str, str]] = (),
        *,
        keep_ms: int = 60_000,
        due_limit: int = 10,
    ) -> Call:
        """Release/park/drop the tokens slot ``slot`` of ``worker`` holds, then claim up to
        ``claim`` new ones and take the jobs whose retries are due. ``seq`` numbers the
        slot's calls: a call sent again with the same number returns the first reply and
        changes nothing. ``keep_ms`` is the lifetime given to the worker hash (which keeps
        the last reply) when it has none."""
        args: list[Any] = [owner(worker, slot), seq, lease_ms, claim, WAKE_CAP, keep_ms,
                           due_limit]
        for tok, mode in settled:
            args += [tok, mode]
        return Call(
            "settle",
            (qk.ready, qk.leased, qk.owners, qk.tokens, qk.parked, qk.wake, qk.fair, qk.kick,
             qk.retries, qk.worker(worker), qk.paused),
            args,
        )

    @staticmethod
    def parse_settle(reply: Sequence[Any]) -> SettleReply:
        """The claimed tokens and their scores, the jobs whose retries are due, the ms
        until the next retry is due (-1: none waits), and whether the queue is paused."""
        claimed, due, wait, paused = reply
        return SettleReply([(s(claimed[i]), float(claimed[i + 1]))
                            for i in range(0, len(claimed), 2)],
                           [s(j) for j in due], int(wait), paused == 1)

    def retoken(self, qk: QueueKeys, job_id: str, priority: int | None,
                concurrency: int | None) -> int:
        """Re-score and resize a registered job's tokens; returns its concurrency before
        (0: no token here). See retoken-7.lua."""
        return int(self.run("retoken", (qk.tokens, qk.ready, qk.parked, qk.leased, qk.kick,
                                        qk.wake, qk.active),
                            (job_id, "" if priority is None else priority,
                             "" if concurrency is None else concurrency, WAKE_CAP)))

    def pause_queue(self, qk: QueueKeys, pause_id: str, wake: int) -> str:
        """Pause one shard (idempotent: a paused shard keeps its pause); returns the id of
        the pause in force. See pause_queue-2.lua."""
        return s(self.run("pause_queue", (qk.paused, qk.wake), (pause_id, min(wake, WAKE_CAP))))

    def resume_queue(self, qk: QueueKeys, wake: int) -> bool:
        """Resume one shard; True when it was paused. See resume_queue-2.lua."""
        return bool(self.run("resume_queue", (qk.paused, qk.wake), (min(wake, WAKE_CAP),)))

    def settle(
        self,
        qk: QueueKeys,
        worker: str,
        slot: int,
        seq: str | int,
        lease_ms: int,
        claim: int,
        settled: Sequence[tuple[str, str]] = (),
    ) -> SettleReply:
        """Run :meth:`settle_call` now."""
        call = self.settle_call(qk, worker, slot, seq, lease_ms, claim, settled)
        return self.parse_settle(self.run(call.name, call.keys, call.args))

    @staticmethod
    def schedule_retry_call(qk: QueueKeys, job_id: str, delay_ms: int) -> Call:
        """Note in the queue's hash slot that ``job_id`` has a retry due in ``delay_ms``."""
        return Call("schedule_retry", (qk.retries,), (job_id, max(0, delay_ms)))

    @staticmethod
    def finish_jobs_call(
        qk: QueueKeys,
        jobs: Sequence[tuple[str, JobReply, str]],
        *,
        events_maxlen: int,
        events_retention_ms: int,
    ) -> Call:
        """Finish terminal jobs, given as (job id, reply, completion message); the
        reply of the call is one code per job: 1 finished now, 0 finished before.
        Events are kept ``events_retention_ms`` (the queue's retention) and at most
        about ``events_maxlen``. The function publishes each completion on the job's
        and the queue's channels (SPUBLISH on a Redis Cluster: :mod:`streamq.notices`)."""
        args: list[Any] = [events_maxlen, events_retention_ms]
        for job_id, job, message in jobs:
            args += [job_id, job.state, job.total, job.done, job.failed, job.retention_ms,
                     job.concurrency, job.dedup, message, job.incarnation, job.dead]
        return Call(
            "finish_jobs",
            (qk.active, qk.finished, qk.events, qk.tokens, qk.ready, qk.leased, qk.parked,
             qk.owners, qk.kick, qk.dedup_expiry, qk.owed, qk.creating),
            args,
        )

    @staticmethod
    def unpark_call(qk: QueueKeys, job_id: str, concurrency: int) -> Call:
        """Send a job's parked tokens back to ready (it got work)."""
        return Call("unpark", (qk.parked, qk.ready, qk.leased, qk.kick, qk.wake),
                    (job_id, concurrency, WAKE_CAP))

    def unpark(self, qk: QueueKeys, job_id: str, concurrency: int) -> int:
        """Send a job's parked tokens back to ready (it got work)."""
        call = self.unpark_call(qk, job_id, concurrency)
        return int(self.run(call.name, call.keys, call.args))

    def heartbeat(
        self,
        qk: QueueKeys,
        worker: str,
        *,
        heartbeat_ttl_ms: int,
        lease_ms: int,
        info_ttl_ms: int,
        info: dict[str, Any],
        tokens: Sequence[tuple[str, int]],
        stats: tuple[str, Sequence[tuple[str, int]]] | None = None,
        stats_window_ms: int = STATS_WINDOW_MS,
    ) -> list[str]:
        """Refresh a worker's heartbeat (alive for ``heartbeat_ttl_ms`` from Redis's clock)
        and the leases its slots hold, given as (token, slot), extended by ``lease_ms``;
        return the tokens no longer held by that slot. ``stats``, a batch (id
        ``<nonce>:<sequence>``, field/value pairs) of :class:`streamq.history.ActivityCounter`,
        is added to the shard's stats stream unless a beat already took it (give it on
        the queue's first shard only)."""
        batch, pairs = stats if stats is not None else ("", ())
        args: list[Any] = [worker, heartbeat_ttl_ms, lease_ms, info_ttl_ms, batch,
                           stats_window_ms, len(pairs)]
        for k, v in pairs:
            args += [k, v]
        args.append(len(info))
        for k, v in info.items():
            args += [k, v]
        for tok, slot in tokens:
            args += [tok, owner(worker, slot)]
        reply = self.run("heartbeat", (qk.workers, qk.worker(worker), qk.leased, qk.owners,
                                       qk.stats), args)
        return [s(t) for t in reply]

    def reserve_dedup(self, qk: QueueKeys, dedup_key: str, job_id: str) -> str:
        """Reserve ``dedup_key`` for ``job_id``; return the job that holds it."""
        return s(self.run("reserve_dedup", (qk.dedup, qk.dedup_expiry, qk.creating),
                           (dedup_key, job_id)))

    def reap_leases(self, qk: QueueKeys, watched_gap_ms: int, grace_ms: int,
                    limit: int = 1000) -> tuple[int, int, list[str]]:
        """Return expired leases and dead workers' leases, judged on the time the reapers
        watched (a gap between two calls longer than ``watched_gap_ms`` was unwatched: its
        deadlines are spared for ``grace_ms`` after it); return (count, the unwatched
        gap's ms while its grace runs or 0, dead worker ids)."""
        r = self.run("reap_leases", (qk.workers, qk.leased, qk.owners, qk.tokens, qk.ready,
                                     qk.wake, qk.reaping),
                     (WAKE_CAP, limit, watched_gap_ms, grace_ms))
        return int(r[0]), int(r[1]), [s(w) for w in r[2:]]

    def forget_job(self, qk: QueueKeys, job_id: str) -> int:
        """Remove an orphan (registered job whose keys are gone) and its tokens."""
        return int(self.run("forget_job", (qk.active, qk.tokens, qk.ready, qk.leased, qk.parked,
                                           qk.owners, qk.kick), (job_id, MAX_CONCURRENCY)))

    def trim(self, qk: QueueKeys, retention_ms: int, limit: int = 1000) -> tuple[int, int, int, bool]:
        """Forget expired dedup keys and `finished` entries (by their own times) and events
        older than ``retention_ms``; return (dedup keys, finished, events, more is due)."""
        r = self.run("trim", (qk.events, qk.finished, qk.dedup, qk.dedup_expiry),
                     (retention_ms, limit))
        return int(r[0]), int(r[1]), int(r[2]), r[3] == 1

    def lock(self, key: str, holder: str, ttl_ms: int) -> bool:
        """Take lock ``key`` for ``holder`` for ``ttl_ms``; also true when ``holder``
        holds it already (the lock keeps its TTL then)."""
        return bool(self.run("lock", (key,), (holder, ttl_ms)))

    def unregister(self, qk: QueueKeys, worker: str) -> bool:
        """Remove a stopping worker from shard ``qk``'s registry, with its description."""
        return bool(self.run("unregister", (qk.workers, qk.worker(worker)), (worker,)))

    def unlock(self, key: str, holder: str) -> bool:
        """Delete lock ``key`` if ``holder`` still owns it."""
        return bool(self.run("unlock", (key,), (holder,)))
