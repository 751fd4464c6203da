"""Following jobs: status snapshots, results, waiting for completion, completion records."""

from __future__ import annotations

import time
from typing import Any

import redis

from . import config, lane, schedule, watchdog
from .codec import decode_result
from .connection import Client, is_transient
from .errors import JobNotFound, WaitTimeout
from .jobs import wrap_connection_errors
from .keys import JobKeys, QueueKeys, check_name, shard_queue
from .models import Completion, JobState, JobStatus
from .notices import Notices


class Following:
    """The reading side of :class:`streamq.client.Queue`."""

    name: str
    redis: Client
    keys: QueueKeys

    @property
    def known_shards(self) -> list[QueueKeys]:
        raise NotImplementedError

    def shard_of(self, tag: str) -> QueueKeys:
        raise NotImplementedError

    def lane_shard(self, job_id: str) -> QueueKeys:
        """The shard a small job (:mod:`streamq.lane`) of id ``job_id`` lives on."""
        return lane.shard_of_job(self.known_shards, job_id)

    @wrap_connection_errors
    def status(self, job_id: str) -> JobStatus:
        """The job's status; JobNotFound for an unknown job."""
        return self._status(job_id)

    def _status(self, job_id: str) -> JobStatus:
        """A snapshot of the job; raises JobNotFound for an unknown or expired job."""
        jk = JobKeys(check_name("job id", job_id))
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(jk.meta)
        pipe.xlen(jk.tasks)
        pipe.zcard(jk.retry)
        pipe.exists(jk.tasks)
        pipe.hget(self.lane_shard(job_id).ljobs, job_id)
        meta_raw, xlen, retries, has_stream, lane_rec = pipe.execute()
        if not meta_raw:
            if lane_rec is not None:
                rec = lane.parse(lane_rec)
                return lane.status(job_id, rec, lane.held(self.redis, self.lane_shard(job_id),
                                                           job_id, rec))
            raise JobNotFound(job_id)
        meta = {k.decode(): v.decode() for k, v in meta_raw.items()}
        pending = 0
        if has_stream:
            try:
                pending = int(self.redis.xpending(jk.tasks, config.GROUP)["pending"])
            except redis.ResponseError:
                pending = 0
        finished = meta.get("finished")
        state = JobState(meta["state"])
        due = int(meta.get("due") or 0) or None
        if schedule.not_yet_due(meta["state"], due, int(xlen), int(meta["done"]),
                                int(meta["failed"]), int(retries)):
            state = JobState.SCHEDULED
        return JobStatus(
            job_id=job_id,
            queue=shard_queue(meta["queue"]),
            state=state,
            priority=int(meta["priority"]),
            concurrency=int(meta["concurrency"]),
            client=meta["client"],
            total=int(meta["total"]),
            done=int(meta["done"]),
            failed=int(meta["failed"]),
            in_flight=pending,
            queued=max(0, int(xlen) - pending) + int(retries),
            created_ms=int(meta["created"]),
            finished_ms=int(finished) if finished else None,
            due_ms=due,
            timeout_s=watchdog.seconds(meta.get("timeout")),
        )

    @wrap_connection_errors
    def results(self, job_id: str) -> dict[int, Any]:
        """The stored results by sub-request index (decoded)."""
        jk = JobKeys(check_name("job id", job_id))
        if not self.redis.exists(jk.meta):
            qk = self.lane_shard(job_id)
            if self.redis.hexists(qk.ljobs, job_id):
                return lane.results(self.redis, qk, job_id)
            raise JobNotFound(job_id)
        raw = self.redis.hscan_iter(jk.results, count=1000)
        return {int(k): decode_result(v) for k, v in raw}

    @wrap_connection_errors
    def wait(self, job_id: str, timeout: float | None = None) -> JobStatus:
        """Block until the job is terminal and return its status.

        Subscribes to the job's channel first and then reads the durable state,
        so a completion that came before the call returns at once. Raises
        WaitTimeout after ``timeout`` seconds, JobNotFound for an unknown job.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self._wait(job_id, deadline, timeout)
            except Exception as e:
                # Redis lost for a moment (a failover, a restart): subscribe again and
                # read the state again, until the deadline; anything else is raised
                if not is_transient(e) or (deadline is not None
                                           and time.monotonic() >= deadline):
                    raise
                time.sleep(0.25)

    def _wait(self, job_id: str, deadline: float | None, timeout: float | None) -> JobStatus:
        jk = JobKeys(check_name("job id", job_id))
        tag: Any = self.redis.hget(jk.meta, "queue")
        # the job's shard announces it (an unknown job: the status read below says so)
        qk = self.keys
        if tag is not None and shard_queue(tag.decode()) == self.name:
            qk = self.shard_of(tag.decode())
        elif tag is None:
            qk = self.lane_shard(job_id)  # a small job's shard is the one its id names
        with Notices(self.redis) as notices:
            notices.subscribe(qk.job_channel(job_id))
            while True:
                st = self._status(job_id)
                if st.terminal:
                    return st
                left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if left <= 0:
                    raise WaitTimeout(f"job {job_id!r} not complete after {timeout} s")
                notices.get(left)

    @wrap_connection_errors
    def completions(self, count: int = 100) -> list[Completion]:
        """The latest completion records of the queue (durable events, of every shard),
        oldest first."""
        out = []
        for qk in self.known_shards:
            entries: list[tuple[bytes, dict[bytes, bytes]]] = self.redis.xrevrange(
                qk.events, count=count)  # type: ignore[assignment]
            for entry_id, f in entries:
                d = {k.decode(): v.decode() for k, v in f.items()}
                out.append((entry_id.decode(), Completion(
                    d["job"], self.name, JobState(d["state"]), int(d["total"]), int(d["done"]),
                    int(d["failed"]), int(d["finished"]))))
        # in the order they were recorded (stream ids are Redis's clock on every shard)
        out.sort(key=lambda e: tuple(int(x) for x in e[0].split("-")))
        return [c for _, c in out[-count:]]
