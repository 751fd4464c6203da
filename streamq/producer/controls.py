"""Flow control of a queue's work, the part of :class:`streamq.client.Queue` that steers
what is queued: pause and resume, re-prioritize, cancel, delete, retry, purge, rate
limits, repeating jobs."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from streamq.base import config
from streamq.base.keys import check_name
from streamq.base.models import JobStatus
from streamq.base.replies import new_token
from streamq.errors import ConfigError, JobNotFound
from streamq.producer import cancel as cancelling
from streamq.producer import flow
from streamq.producer import rates as ratelimits
from streamq.producer.job_store import find_job
from streamq.producer.jobs import wrap_connection_errors
from streamq.producer.repeating import Repeats

if TYPE_CHECKING:
    from streamq.model.queue_view import QueueJobs as Queue


def check_range(name: str, value: int, lo: int, hi: int) -> int:
    """``value``, when it is an integer from ``lo`` to ``hi``; ConfigError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{name} must be an integer from {lo} to {hi}, got {value!r}")
    return value


class Controls:
    """Flow control methods of :class:`streamq.client.Queue`."""

    @property
    def _queue(self) -> Queue:
        return cast("Queue", self)

    @property
    def repeats(self) -> Repeats:
        """The queue's repeating jobs: add, list, pause, resume, remove
        (:mod:`streamq.producer.repeating`)."""
        return Repeats(self._queue)

    @wrap_connection_errors
    def pause(self, *, wait: bool = True, timeout: float = 30.0) -> flow.PauseReport:
        """Pause the queue: workers finish what they hold and claim nothing new until
        :meth:`resume`. With ``wait`` (the default) this returns once every live worker
        slot has seen the pause, so no sub-request starts after it returns
        (``report.complete``); a slot still busy at ``timeout`` is listed in
        ``report.waiting``. Pausing a paused queue keeps its pause."""
        return flow.pause(self._queue, wait=wait, timeout=timeout)

    @wrap_connection_errors
    def resume(self) -> bool:
        """Resume a paused queue (idle workers wake at once); False when it was not
        paused."""
        return flow.resume(self._queue) > 0

    @wrap_connection_errors
    def reprioritize(self, job_id: str, *, priority: int | None = None,
                     concurrency: int | None = None) -> JobStatus:
        """Change a queued or running job's priority and/or concurrency limit (its
        next claim follows them); returns its status. See
        :meth:`streamq.producer.job_store.StreamJob.reprioritize`; a small job's entry
        moves to the new priority's lane (:meth:`~streamq.producer.job_store.LaneJob.reprioritize`:
        ConfigError while a worker runs it)."""
        check_name("job id", job_id)
        if priority is not None:
            check_range("priority", priority, 0, config.MAX_PRIORITY)
        if concurrency is not None:
            check_range("concurrency", concurrency, 1, config.MAX_CONCURRENCY)
        if priority is None and concurrency is None:
            raise ConfigError("give a new priority, a new concurrency, or both")
        find_job(self._queue, job_id).reprioritize(priority, concurrency)
        return self._queue.status(job_id)

    @wrap_connection_errors
    def cancel(self, job_id: str, *, wait: bool = True, timeout: float = 30.0,
               token: str | None = None) -> cancelling.CancelReport:
        """Cancel a job: none of its sub-requests starts after this returns (with
        ``wait``, until ``timeout``: ``report.complete``); those running finish and keep
        their results; it ends ``cancelled`` with one completion. A finished job is left
        as it is (``report.cancelled`` False). ``token`` names this cancel across
        retries of it (a retry reports what the first call did). See
        :mod:`streamq.cancel`."""
        check_name("job id", job_id)
        if timeout < 0:
            raise ValueError("timeout must be >= 0")
        return cancelling.cancel(self._queue, job_id, wait=wait, timeout=timeout, token=token)

    @wrap_connection_errors
    def delete(self, job_id: str, *, cancel: bool = False, timeout: float = 30.0) -> None:
        """Delete a finished job's records now, rather than when its retention ends: its
        status, results and errors are gone (JobNotFound after), whichever lane it rode.
        A job that has not finished is refused (ConfigError) unless ``cancel``: then it
        is cancelled first (:meth:`cancel`, waiting up to ``timeout`` until no worker
        starts any of its sub-requests; one running finishes into nothing). Its
        completion record stays in the queue's history, its dead letters in the dead
        stream (replayed, one goes to a new job)."""
        check_name("job id", job_id)
        if timeout < 0:
            raise ValueError("timeout must be >= 0")
        q = self._queue
        store = find_job(q, job_id)
        if cancel:
            report = cancelling.cancel(q, job_id, wait=True, timeout=timeout)
            if not report.complete:
                raise ConfigError(f"job {job_id!r} is cancelled, but workers holding its "
                                  f"sub-requests had not all seen it within {timeout:g} s: "
                                  "nothing was deleted; try again")
        store.delete()

    @wrap_connection_errors
    def retry(self, job_id: str, *, token: str | None = None) -> int:
        """Re-run a failed or partial job's dead-lettered sub-requests in place, once: they
        go back into the job with no attempt made and leave its dead letters (and the
        dead stream); the job is ``active`` again and completes once more, its results so
        far kept. Returns how many went back. A job that has not finished, or did not
        fail, is refused (ConfigError). Each dead letter runs again once, whether this or
        ``replay_dead`` takes it first; ``token`` names this retry across resends of it
        (a resend returns what the first did). See :mod:`streamq.producer.retrying`."""
        check_name("job id", job_id)
        token = check_name("retry token", token) if token else new_token()
        return find_job(self._queue, job_id).retry(token)

    @wrap_connection_errors
    def unfinished(self) -> list[str]:
        """The ids of the queue's jobs that have not ended (queued, scheduled, running,
        open), on both lanes and every shard."""
        q = self._queue
        out: list[str] = []
        for qk in q.known_shards:
            for key in (qk.active, qk.lactive):
                out += [m.decode() if isinstance(m, bytes) else str(m)
                        for m, _ in q.redis.zscan_iter(key, count=1000)]
        return out

    @wrap_connection_errors
    def purge(self) -> int:
        """Cancel every job of the queue that has not ended (:meth:`cancel` each, on
        both lanes): none of their sub-requests starts any more, those running finish;
        each ends ``cancelled`` with its one completion, kept until its retention ends.
        Returns how many this call cancelled (one that ended meanwhile is left alone)."""
        n = 0
        for job_id in self.unfinished():
            try:
                n += cancelling.cancel(self._queue, job_id, wait=False).cancelled
            except JobNotFound:
                pass  # ended and expired since the listing
        return n

    @wrap_connection_errors
    def set_rate(self, per_second: float | None, *, client: str | None = None,
                 burst: int | None = None) -> bool:
        """Limit the sub-requests started per second, of ``client`` or (None) of the
        whole queue, to ``per_second`` with up to ``burst`` saved (default: one
        second's); None clears the limit. Work over a limit waits. True when the stored
        limit changed (setting it again is a no-op). See :mod:`streamq.rates`."""
        return ratelimits.set_rate(self._queue, per_second, client, burst)

    @wrap_connection_errors
    def rates(self) -> ratelimits.RateLimits:
        """The queue's rate limits (:meth:`set_rate`)."""
        return ratelimits.read_rates(self._queue.redis, self._queue.keys)

    @wrap_connection_errors
    def is_paused(self) -> bool:
        """True when any shard of the queue is paused."""
        return flow.paused_shards(self._queue) > 0
