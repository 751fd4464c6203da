"""The reaper: recovers stalled work, dead workers, unfinished completions.

Its passes are plain methods with no timers (:mod:`streamq.scheduler` runs
them on an interval). Each is idempotent and every change it makes is one
atomic script, so several reaper replicas may run side by side; a lock with
a TTL keeps them from doing the same pass at the same moment.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from typing import Any

import redis

from streamq.base import config, hooks
from streamq.base.members import parse_intent
from streamq.base.metrics import ReaperMetrics
from streamq.errors import StreamqError
from streamq.model.scripts import JobReply, LaneCtx
from streamq.producer.client import Queue
from streamq.producer.deadletters import announce
from streamq.reaping.lane_reaper import LanePass, recover_lanes
from streamq.reaping.reap_parts import PassReport, delete_idle_consumers, undelivered
from streamq.reaping.ticker import tick_repeats
from streamq.storage.connection import Client, is_access_error, is_transient, server_ms

log = logging.getLogger("streamq.reaper")

REAPER_CONSUMER = config.REAPER_CONSUMER
#: Most dedup keys and `finished` entries one trim call removes, and calls per pass.
_TRIM_LIMIT, _TRIM_CALLS = 1000, 10
#: Most intents one pass finishes.
_INTENT_LIMIT = 500
_META = ("state", "total", "done", "failed", "concurrency", "dedup", "priority", "client",
         "created", "retention", "incarnation", "dead", "due")


class Reaper:
    """Recovery passes for one queue."""

    def __init__(
        self,
        queue: str,
        url: str | None = None,
        *,
        client: Client | None = None,
        min_idle_s: float = config.DEFAULT_MIN_IDLE_S,
        max_deliveries: int = 0,
        retention_s: float = config.DEFAULT_RETENTION_S,
        intent_grace_s: float = config.DEFAULT_INTENT_GRACE_S,
        interval_s: float = config.DEFAULT_REAPER_INTERVAL_S,
        lock_ttl_s: float = config.REAPER_LOCK_TTL_S,
        exclusive: bool = True,
        metrics_port: int | None = None,
        metrics_addr: str = "0.0.0.0",
        watched_gap_s: float | None = None,
    ) -> None:
        self.q = Queue(queue, url, client=client, retention_s=retention_s)
        self.redis = self.q.redis
        self.scripts = self.q.scripts
        self.scripts.outlast_s = 0.0  # (its passes wait a refusing Redis out)
        self.keys = self.q.keys
        self.min_idle_ms = int(min_idle_s * 1000)
        #: the idle time past which this shard pass reclaims an entry: min_idle, plus the
        #: last gap no reaper watched (Redis away) while its grace runs
        self.idle_ms = self.min_idle_ms
        #: the longest time between two passes (of any reaper) that counts as watched: a
        #: longer one means Redis (or every reaper) was away, and deadlines that fell in
        #: it are spared for min_idle after it (``reap_leases``); 1.5 intervals unless
        #: given. It must stay below twice the workers' heartbeat: an outage that lapses
        #: a registration is longer than that, and must read as unwatched
        if watched_gap_s is None:  # (the default heartbeat's, for a rare pass)
            watched_gap_s = min(interval_s * 1.5, 2 * config.DEFAULT_HEARTBEAT_S)
        self.watched_gap_ms = max(1, int(watched_gap_s * 1000))
        self.max_deliveries = max_deliveries
        self.intent_grace_ms = int(intent_grace_s * 1000)
        self.lock_ttl_ms = int(lock_ttl_s * 1000)
        self.exclusive = exclusive
        self.id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.metrics = ReaperMetrics(queue)
        if metrics_port is not None:
            self.metrics.serve(metrics_port, metrics_addr)
        hooks.install_from_env()  # (the crash tests' fault points: streamq.hooks)

    def run_once(self) -> PassReport:
        """Run every pass once on every shard of the queue (each shard has its own pass
        lock: a shard another reaper is passing over is skipped)."""
        report = PassReport(repeats_submitted=self.tick_repeats())
        skipped = 0
        shards = self.q.known_shards
        for qk in shards:
            self.keys = qk
            if not self._shard_pass(report):
                skipped += 1
        self.keys = self.q.keys
        report.skipped = skipped == len(shards)
        if report.skipped:
            return report
        m = self.metrics
        m.passes.inc()
        m.reclaimed.inc(report.reclaimed)
        m.dead_lettered.inc(report.dead_lettered)
        m.leases_returned.inc(report.leases_returned)
        m.active_jobs.set(report.jobs_checked - report.finished - report.orphans
                          + report.lane_active)
        m.backlog.clear()
        for prio, n in report.backlog.items():
            m.backlog.labels(queue=m.queue, priority=str(prio)).set(n)
        if any((report.leases_returned, report.reclaimed, report.dead_lettered,
                report.finished, report.orphans, report.dead_workers, report.announced,
                report.intents_registered, report.intents_finished,
                report.intents_dropped, report.repeats_submitted)):
            log.info("reaper pass: %s", report.summary())
        return report

    def tick_repeats(self) -> int:
        """Submit the due ticks of the queue's repeats (:mod:`streamq.reaping.ticker`):
        at the start of every pass, and every second between them."""
        return tick_repeats(self.q)

    def _shard_pass(self, report: PassReport) -> bool:
        """Every pass over the shard in ``self.keys``; False when another reaper holds
        its lock."""
        if self.exclusive and not self._lock():
            return False
        try:
            returned, unwatched, dead = self.scripts.reap_leases(
                self.keys, self.watched_gap_ms, self.min_idle_ms)
            self.idle_ms = self.min_idle_ms + unwatched
            report.leases_returned += returned
            report.dead_workers = sorted({*report.dead_workers, *dead})
            self.recover_intents(report)
            self.recover_jobs(report)
            recover_lanes(LanePass(self.keys, self.redis, self.scripts, LaneCtx.of(self.q),
                                   self.idle_ms, self.min_idle_ms, self.max_deliveries),
                          report)
            self.announce_owed(report)
            self.trim()
        finally:
            if self.exclusive:
                self.scripts.unlock(self.keys.reaper_lock, self.id)
        return True

    def _lock(self) -> bool:
        """Take the pass lock; also true when this reaper holds it still (a pass of its
        own cut short by a Redis error left it behind)."""
        return self.scripts.lock(self.keys.reaper_lock, self.id, self.lock_ttl_ms)

    # -- passes ----------------------------------------------------------------------

    def recover_intents(self, report: PassReport) -> None:
        """Finish the submits whose producer died between the job-slot create and the
        queue-slot register: every intent older than the grace period (Redis's clock),
        at most ``_INTENT_LIMIT`` per pass. A live job is registered, a terminal one
        finished (both idempotent, both remove the intent); an intent whose job has no
        meta (its create never ran) is dropped, releasing the dedup key it reserved."""
        cut = server_ms(self.redis, self.keys.creating) - self.intent_grace_ms
        rows: Any = self.redis.zrangebyscore(self.keys.creating, "-inf", cut, start=0,
                                             num=_INTENT_LIMIT, withscores=True)
        if not rows:
            return
        intents = [(*parse_intent(member.decode()), int(score)) for member, score in rows]
        pipe = self.redis.pipeline(transaction=False)
        for job, _dedup, _ms in intents:
            pipe.hmget(self.keys.job(job).meta, *_META, "queue")
        metas: list[Any] = pipe.execute()
        live: list[tuple[str, JobReply]] = []
        for (job, dedup, written_ms), m in zip(intents, metas):
            if m[0] is None or m[-1] is None or m[-1].decode() != self.keys.tag:
                # no job (its create never ran), or a job that lives on another shard
                # (its id named a job made before): this shard has nothing to finish
                dropped, _released = self.scripts.drop_intent(self.keys, job, dedup, written_ms)
                report.intents_dropped += int(dropped)
                continue
            # the intent names the dedup key its submit reserved: the steps below remove
            # exactly that intent (and a finish releases that key with the job)
            reply = JobReply.parse([1, *m[:-1]])._replace(dedup=dedup)
            if reply.state in ("open", "active"):
                live.append((job, reply))
            else:
                self._finish(job, reply, report)
                report.intents_finished += 1
        if live:
            self.q.register(live, self.keys)
            report.intents_registered += len(live)

    def recover_jobs(self, report: PassReport) -> None:
        """Every registered job: finish, forget, promote retries, reclaim stalled entries."""
        # alive by Redis's clock (heartbeat deadlines are Redis's clock), not this process's
        live: Any = self.redis.zrangebyscore(self.keys.workers,
                                             server_ms(self.redis, self.keys.workers), "+inf")
        alive = {w.decode() for w in live}
        batch: list[str] = []
        members: Any = self.redis.zscan_iter(self.keys.active, count=500)
        for member, _score in members:
            batch.append(member.decode())
            if len(batch) >= 200:
                self._recover_batch(batch, alive, report)
                batch = []
        if batch:
            self._recover_batch(batch, alive, report)

    def _recover_batch(self, jobs: list[str], alive: set[str], report: PassReport) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for job in jobs:
            pipe.hmget(self.keys.job(job).meta, *_META)
            pipe.exists(self.keys.job(job).unannounced)
        got: list[Any] = pipe.execute()
        for n, job in enumerate(jobs):
            m, owes = got[2 * n], got[2 * n + 1]
            report.jobs_checked += 1
            try:
                if owes and m[0] in (b"open", b"active"):
                    # a live job's dead letters whose announce was cut short
                    report.announced += announce(self.scripts, self.keys, job).added
                self._recover_one(job, m, alive, report)
            except (redis.ResponseError, ValueError, TypeError, StreamqError) as e:
                # one job's broken keys (wrong type, corrupt meta) must not stop the
                # recovery of every job after it; a Redis that cannot serve now (OOM,
                # BUSY, ...) or refuses access ends the pass, as connection errors do
                if is_transient(e) or is_access_error(e):
                    raise
                log.error("reaper: job %s could not be recovered: %s: %s", job,
                          type(e).__name__, e)
                report.job_errors.append(job)
            hooks.at("reaper_mid_pass")

    def _recover_one(self, job: str, m: list[Any], alive: set[str],
                     report: PassReport) -> None:
        if m[0] is None:
            # an orphan: its dead letters are announced first (it leaves `active`, the
            # marker that would bring the reaper back), what is left of it expires
            report.announced += announce(self.scripts, self.keys, job).added
            self.scripts.expire_orphan(self.keys.job(job), self.q.retention_ms)
            self.scripts.forget_job(self.keys, job)
            report.orphans += 1
            return
        reply = JobReply.parse([1, *m])
        if reply.state not in ("open", "active"):
            self._finish(job, reply, report)
            return
        self._recover_job(job, reply, alive, report)

    def _recover_job(self, job: str, reply: JobReply, alive: set[str],
                     report: PassReport) -> None:
        jk = self.keys.job(job)
        moved, _ = self.scripts.promote_retries(jk)
        report.retries_promoted += moved
        work = moved > 0
        cursor, dead, completed = "0-0", 0, False
        for _ in range(1000):  # bounded: XAUTOCLAIM examines RECLAIM_COUNT entries per call
            cursor, readded, d, job_reply = self.scripts.reclaim(
                jk, consumer=REAPER_CONSUMER, min_idle_ms=self.idle_ms, cursor=cursor,
                count=config.RECLAIM_COUNT, max_deliveries=self.max_deliveries)
            report.reclaimed += readded
            dead += d
            work = work or readded > 0
            if job_reply.completed:
                completed, reply = True, job_reply
            if cursor == "0-0":
                break
        report.dead_lettered += dead
        if dead and not completed:
            report.announced += announce(self.scripts, self.keys, job).added
        if completed:
            self._finish(job, reply, report)
            return
        lag = undelivered(self.redis, jk)
        waiting = lag + int(self.redis.zcard(jk.retry))
        report.backlog[reply.priority] = report.backlog.get(reply.priority, 0) + waiting
        if work or lag:
            self.scripts.unpark(self.keys, job, reply.concurrency)
        report.consumers_deleted += delete_idle_consumers(self.redis, self.scripts, jk, alive,
                                                          self.min_idle_ms)

    def _finish(self, job: str, reply: JobReply, report: PassReport) -> None:
        # announced first, so a completion shows its dead letters; the finish marks a
        # job with dead letters in `owed`, which it leaves once none is left
        left = 0
        if reply.dead:
            done = announce(self.scripts, self.keys, job)
            report.announced += done.added
            left = done.left
        call = self.q.finish_call(job, reply, self.keys)
        report.finished += int(self.scripts.run(call.name, call.keys, call.args)[0])
        if reply.dead and left == 0:
            self.scripts.clear_owed(self.keys, job)

    def announce_owed(self, report: PassReport) -> None:
        """Finished jobs that recorded dead letters (the queue's ``owed`` set): announce
        what they still owe, then remove them (the second step of every announce cut
        short, for terminal jobs; live ones are announced from ``active``)."""
        owed: Any = self.redis.zrange(self.keys.owed, 0, config.OWED_PER_PASS - 1,
                                      withscores=True)
        for member, score in owed:
            job = member.decode()
            try:
                self._announce(job, score, report)
            except (redis.ResponseError, ValueError, TypeError, StreamqError) as e:
                if is_transient(e) or is_access_error(e):
                    raise  # as in recover_jobs: the pass ends
                log.error("reaper: dead letters of job %s could not be announced: %s: %s",
                          job, type(e).__name__, e)
                report.job_errors.append(job)

    def _announce(self, job: str, score: float | None, report: PassReport) -> None:
        """Announce a finished job's dead letters; once none is left, it owes nothing."""
        done = announce(self.scripts, self.keys, job)
        report.announced += done.added
        if done.left == 0 and done.terminal:
            self.scripts.clear_owed(self.keys, job, score)

    def trim(self) -> tuple[int, int, int]:
        """Forget expired dedup keys and `finished` entries whose time has passed, and
        completion records older than the reaper's retention, by Redis's clock, each
        call one script; return (dedup keys, finished entries, events) removed."""
        total = [0, 0, 0]
        for _ in range(_TRIM_CALLS):
            dedup, finished, events, more = self.scripts.trim(self.keys, self.q.retention_ms,
                                                              _TRIM_LIMIT)
            total = [total[0] + dedup, total[1] + finished, total[2] + events]
            if not more:
                break
        return total[0], total[1], total[2]
