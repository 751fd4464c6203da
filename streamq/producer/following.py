"""Following jobs: status snapshots, results, waiting for completion, completion records."""

from __future__ import annotations

import time
from typing import Any, cast

from streamq.base.config import ANNOUNCE_WAIT_S
from streamq.base.keys import QueueKeys
from streamq.base.models import Completion, JobState, JobStatus
from streamq.errors import WaitTimeout
from streamq.producer.connected import Connected
from streamq.producer.job_store import JobHome, find_job, lane_shard
from streamq.producer.jobs import outlasting, wrap_connection_errors
from streamq.services.notices import Notices
from streamq.storage.connection import is_transient


class Following(Connected):
    """The reading side of :class:`streamq.client.Queue`."""

    name: str
    keys: QueueKeys

    @property
    def known_shards(self) -> list[QueueKeys]:
        raise NotImplementedError

    def shard_of(self, tag: str) -> QueueKeys:
        raise NotImplementedError

    def lane_shard(self, job_id: str) -> QueueKeys:
        """The shard a small job (:mod:`streamq.lane`) of id ``job_id`` lives on."""
        return lane_shard(self._home, job_id)

    @wrap_connection_errors
    @outlasting
    def status(self, job_id: str) -> JobStatus:
        """The job's status; JobNotFound for an unknown job."""
        return self._status(job_id)

    def _status(self, job_id: str) -> JobStatus:
        """A snapshot of the job; raises JobNotFound for an unknown or expired job."""
        return find_job(self._home, job_id).status()

    @property
    def _home(self) -> JobHome:
        return cast("JobHome", self)

    @wrap_connection_errors
    @outlasting
    def results(self, job_id: str) -> dict[int, Any]:
        """The stored results by sub-request index (decoded)."""
        return find_job(self._home, job_id).results()

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
        # the job's shard announces it (JobNotFound for an unknown job)
        qk = find_job(self._home, job_id).shard
        announcing: float | None = None  # until when a failed job's dead letters are awaited
        with Notices(self.redis) as notices:
            notices.subscribe(qk.job_channel(job_id))
            while True:
                st = self._status(job_id)
                now = time.monotonic()
                if st.terminal:
                    if announcing is None:
                        announcing = now + ANNOUNCE_WAIT_S
                    if not self._announcing(st) or now >= announcing or (
                            deadline is not None and now >= deadline):
                        return st
                left = 1.0 if deadline is None else min(1.0, deadline - now)
                if left <= 0:
                    raise WaitTimeout(f"job {job_id!r} not complete after {timeout} s")
                notices.get(min(left, 0.1) if announcing is not None else left)

    def _announcing(self, st: JobStatus) -> bool:
        """True while a terminal job's dead letters wait for their worker to copy them to
        the queue's dead stream (a small job's are written there with its failure)."""
        return st.failed > 0 and bool(self.redis.scard(self.keys.job(st.job_id).unannounced))

    @wrap_connection_errors
    @outlasting
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
