"""One job model for the producer: where a job lives and what a producer reads or
changes of it, behind one interface (:class:`JobStore`) with two implementations:

- :class:`StreamJob`, a job on a stream of its own (its meta hash, stream, retry set
  and results in its own hash slot; its tokens in its shard's);
- :class:`LaneJob`, a small job (:mod:`streamq.lane`): one record in its shard's
  ``ljobs`` and one entry of a lane stream, all in the shard's slot.

:func:`find_job` reads which one a job id names (one round trip) and returns it;
status, results, the settings a replay copies, cancel, re-prioritize, delete and retry
are then asked of the store, and no caller asks which lane it holds. Where the two differ by
design (a small job's priority cannot change while a worker runs it) the store says
so; docs/design/job-life.md lists each difference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import redis

from streamq.base import config
from streamq.base.codec import decode_result
from streamq.base.keys import QueueKeys, check_name, shard_queue
from streamq.base.models import JobState, JobStatus
from streamq.base.replies import Call, JobReply, ScriptErrorCode
from streamq.errors import ConfigError, JobNotFound, ScriptError
from streamq.model.lane_scripts import LaneCtx
from streamq.model.queue_view import QueueStore
from streamq.producer import lane, retrying
from streamq.producer.flow import live_workers
from streamq.services import schedule, watchdog
from streamq.services.shards import shard_index


class JobHome(QueueStore, Protocol):
    """What a job's store needs of its queue client: its store, and the call that
    records a terminal job's completion in the queue's hash slot."""

    def finish_call(self, jid: str, reply: JobReply, qk: QueueKeys | None = None) -> Call: ...

    def register(self, jobs: Sequence[tuple[str, JobReply]], qk: QueueKeys | None = None
                 ) -> None: ...


class JobSettings(NamedTuple):
    """What a replay of a job's dead letter copies from the job."""

    priority: int = config.DEFAULT_PRIORITY
    client: str = config.DEFAULT_CLIENT
    max_deliveries: int = config.DEFAULT_MAX_DELIVERIES
    timeout_ms: int = 0


class Cancelled(NamedTuple):
    """What a store's cancel did: the job's state after it, whether this call
    cancelled it, how many of its entries workers held, and (when it cancelled the
    job and entries are held) how to list the live workers still holding them that
    have not noted the cancel."""

    state: str
    cancelled: bool
    held: int
    unnoted: Callable[[], list[str]] | None


class JobStore(Protocol):
    """A job of one queue, whichever lane it rides."""

    job_id: str
    #: the queue shard that announces the job (its completion, its channel)
    shard: QueueKeys

    def status(self) -> JobStatus: ...

    def results(self) -> dict[int, Any]: ...

    def settings(self) -> JobSettings: ...

    def cancel(self, token: str) -> Cancelled: ...

    def reprioritize(self, priority: int | None, concurrency: int | None) -> None: ...

    def delete(self) -> None:
        """Delete the job's records now (it must have finished)."""

    def retry(self, token: str) -> int:
        """Re-run its dead-lettered sub-requests in place, once; how many went back."""


def lane_shard(q: JobHome, job_id: str) -> QueueKeys:
    """The shard a small job of id ``job_id`` lives on (the one its id names)."""
    return lane.shard_of_job(q.known_shards, job_id)


def find_job(q: JobHome, job_id: str) -> JobStore:
    """The store of job ``job_id`` of queue ``q`` (one round trip; more for a finished
    small job, whose retention is checked: :func:`streamq.lane.kept`); JobNotFound for
    an unknown job, a job of another queue, a small job whose retention passed, or an
    invalid id."""
    check_name("job id", job_id)
    qk = lane_shard(q, job_id)
    pipe = q.redis.pipeline(transaction=False)
    pipe.hget(qk.job(job_id).meta, "queue")
    pipe.hget(qk.ljobs, job_id)
    pipe.zscore(qk.ldone, job_id)
    tag, rec, forget = pipe.execute()
    if tag is not None:
        if shard_queue(tag.decode()) != q.name:
            raise JobNotFound(job_id)
        return StreamJob(q, job_id, q.shard_of(tag.decode()))
    if (rec is not None and shard_queue(str(lane.parse(rec, qk.tag)["queue"])) == q.name
            and lane.kept(q.redis, [(qk, job_id, rec, forget)])[0]):
        return LaneJob(q, job_id, qk)
    raise JobNotFound(job_id)


def small_job_kept(q: JobHome, job_id: str) -> bool:
    """Whether ``job_id`` names a small job of ``q`` that is still kept (not past its
    retention): an id a caller gives to a new job is checked here first, as the job
    lane's create finds a job of that id (:meth:`streamq.Queue.submit`)."""
    qk = lane_shard(q, job_id)
    rec = lane.kept_records(q.redis, [(qk, job_id)])[0]
    return rec is not None and shard_queue(str(lane.parse(rec, qk.tag)["queue"])) == q.name


def reused_small(q: JobHome, job_id: str, dedup_key: str | None) -> bool:
    """Whether the id a new job is to get (``job_id``, a dedup key's holder when one
    holds it) names a small job still kept: the caller then returns that job (created
    False) and creates nothing, as the job lane's create returns the job an id names. A
    small job holds no dedup key: one reserved for it here is released at once (the
    reaper would release it, its job having no meta).

    The check comes before the create, not in it: a small job made between the two is
    not seen. Its id would have to be taken before its submit returned it, and small
    job ids are generated (random), so a caller meets only small jobs that exist."""
    if not small_job_kept(q, job_id):
        return False
    if dedup_key is not None:
        qk = q.shards[shard_index(dedup_key, len(q.shards))]
        written: Any = q.redis.zscore(qk.creating, f"{job_id}|{dedup_key}")
        if written is not None:
            q.scripts.drop_intent(qk, job_id, dedup_key, int(written))
    return True


def _live(q: JobHome, qk: QueueKeys, workers: list[str]) -> list[str]:
    """Those of ``workers`` whose registration is live on shard ``qk``."""
    if not workers:
        return []
    live = set(live_workers(q, qk))
    return [w for w in workers if w in live]


class StreamJob:
    """A job on a stream of its own."""

    def __init__(self, q: JobHome, job_id: str, shard: QueueKeys) -> None:
        self.q, self.job_id, self.shard = q, job_id, shard
        self.keys = shard.job(job_id)

    def status(self) -> JobStatus:
        jk, r = self.keys, self.q.redis
        pipe = r.pipeline(transaction=False)
        pipe.hgetall(jk.meta)
        pipe.xlen(jk.tasks)
        pipe.zcard(jk.retry)
        pipe.exists(jk.tasks)
        meta_raw, xlen, retries, has_stream = pipe.execute()
        if not meta_raw:
            raise JobNotFound(self.job_id)  # expired since it was found
        meta = {k.decode(): v.decode() for k, v in meta_raw.items()}
        pending = 0
        if has_stream:
            try:
                pending = int(r.xpending(jk.tasks, config.GROUP)["pending"])
            except redis.ResponseError:
                pending = 0
        finished = meta.get("finished")
        state = JobState(meta["state"])
        due = int(meta.get("due") or 0) or None
        if schedule.not_yet_due(meta["state"], due, int(xlen), int(meta["done"]),
                                int(meta["failed"]), int(retries)):
            state = JobState.SCHEDULED
        return JobStatus(
            job_id=self.job_id, queue=shard_queue(meta["queue"]), state=state,
            priority=int(meta["priority"]), concurrency=int(meta["concurrency"]),
            client=meta["client"], total=int(meta["total"]), done=int(meta["done"]),
            failed=int(meta["failed"]), in_flight=pending,
            queued=max(0, int(xlen) - pending) + int(retries),
            created_ms=int(meta["created"]),
            finished_ms=int(finished) if finished else None, due_ms=due,
            timeout_s=watchdog.seconds(meta.get("timeout")))

    def results(self) -> dict[int, Any]:
        raw = self.q.redis.hscan_iter(self.keys.results, count=1000)
        return {int(k): decode_result(v) for k, v in raw}

    def settings(self) -> JobSettings:
        meta: Any = self.q.redis.hmget(self.keys.meta, "priority", "client",
                                       "max_deliveries", "timeout")
        return _settings([m.decode() if isinstance(m, bytes) else m for m in meta])

    def cancel(self, token: str) -> Cancelled:
        """``cancel_job`` in the job's hash slot, then its one completion in the shard's (a
        no-op when it was recorded before)."""
        q = self.q
        held, reply = q.scripts.cancel_job(self.keys, token)
        if reply.state != "cancelled":
            return Cancelled(reply.state, reply.completed, held, None)
        call = q.finish_call(self.job_id, reply, self.shard)
        q.scripts.run(call.name, call.keys, call.args)
        return Cancelled(reply.state, reply.completed, held, self._unnoted)

    def _unnoted(self) -> list[str]:
        """Live workers holding entries of the cancelled job that have not noted it."""
        q, qk, jk = self.q, self.shard, self.keys
        try:
            summary: Any = q.redis.xpending(jk.tasks, config.GROUP)
        except Exception as e:  # noqa: BLE001 - the stream (or its group) is gone: none held
            if "NOGROUP" in str(e) or "no such key" in str(e).lower():
                return []
            raise
        holders = [c["name"].decode() if isinstance(c["name"], bytes) else str(c["name"])
                   for c in summary.get("consumers") or [] if int(c["pending"]) > 0]
        return _unlisted(q, qk, _live(q, qk, holders), self.job_id)

    def reprioritize(self, priority: int | None, concurrency: int | None) -> None:
        """Two steps, each idempotent: the tokens in the queue's hash slot (``retoken``: what
        workers claim by), then the meta in the job's hash slot (``reprioritize_job``: what
        status shows); a caller killed between them leaves the new tokens with the old
        figures shown, and the call made again completes it."""
        q, jk = self.q, self.keys
        _check_live(self.job_id, q.redis.hget(jk.meta, "state"))
        if q.scripts.retoken(self.shard, self.job_id, priority, concurrency) == 0:
            _check_live(self.job_id, q.redis.hget(jk.meta, "state"))  # it finished meanwhile
            raise ConfigError(f"job {self.job_id!r} is not registered in its queue yet (its "
                              "submit is still in progress): try again in a moment")
        try:
            q.scripts.reprioritize_job(jk, priority, concurrency)
        except ScriptError as e:
            if e.code != ScriptErrorCode.JOB_FINISHED:
                raise


    def delete(self) -> None:
        self.q.scripts.delete_job(self.keys)

    def retry(self, token: str) -> int:
        return retrying.retry_stream(self.q, self.shard, self.job_id, token)


class LaneJob:
    """A small job: its record in its shard's ``ljobs``, one entry of a lane stream."""

    def __init__(self, q: JobHome, job_id: str, shard: QueueKeys) -> None:
        self.q, self.job_id, self.shard = q, job_id, shard

    def _record(self) -> dict[str, Any]:
        raw: Any = self.q.redis.hget(self.shard.ljobs, self.job_id)
        if raw is None:
            raise JobNotFound(self.job_id)  # expired since it was found
        return lane.parse(raw, self.shard.tag)

    def _records(self, tries: int = 10) -> Iterator[dict[str, Any]]:
        """The record, read again for each call that found it naming another lane than
        the one read (the job moved meanwhile: ``lane_reprioritize``), ``tries`` times
        at most."""
        for _ in range(tries):
            yield self._record()
        raise ConfigError(f"job {self.job_id!r} changed priority meanwhile: try again")

    def status(self) -> JobStatus:
        rec = self._record()
        return lane.status(self.job_id, rec,
                           lane.held(self.q.redis, self.shard, self.job_id, rec))

    def results(self) -> dict[int, Any]:
        return lane.results(self.q.redis, self.shard, self.job_id)

    def settings(self) -> JobSettings:
        rec = self._record()
        return _settings([rec.get("priority"), rec.get("client"), rec.get("max_deliveries"),
                          None])

    def cancel(self, token: str) -> Cancelled:
        """``lane_cancel`` in the shard's slot; when a worker holds the entry, the
        cancel waits until that worker lists the job as cancelled (its beat reads the
        records of the small jobs its slots hold: it never starts the entry after
        that), or the entry is settled, or the worker is dead, as a job lane job's
        cancel waits for the workers holding its entries."""
        q, qk = self.q, self.shard
        for rec in self._records():
            prio, client = int(rec["priority"]), str(rec["client"])
            cancelled, held = q.scripts.lane_cancel(qk, (prio, client), LaneCtx.of(q),
                                                    self.job_id, token)
            if cancelled is not None:  # (None: it moved)
                break
        done = bool(cancelled)
        # not cancelled here (another did, or it ended): its state read again, not the
        # one read before the call
        state = "cancelled" if done else self._state_now(str(rec["state"]))
        if state != "cancelled" or not held:
            return Cancelled(state, done, 1 if held else 0, None)
        stream = qk.lane(prio, client)

        def unnoted() -> list[str]:
            holder: Any = q.redis.xpending_range(stream, config.GROUP, held, held, 1)
            live = _live(q, qk, [h["consumer"].decode() if isinstance(h["consumer"], bytes)
                                 else str(h["consumer"]) for h in holder])
            return _unlisted(q, qk, live, self.job_id)

        return Cancelled(state, done, 1, unnoted)

    def _state_now(self, before: str) -> str:
        raw: Any = self.q.redis.hget(self.shard.ljobs, self.job_id)
        return str(lane.parse(raw, self.shard.tag)["state"]) if raw else before

    def reprioritize(self, priority: int | None, concurrency: int | None) -> None:
        """``lane_reprioritize`` in the shard's slot: a waiting entry (or a retry of it)
        moves to the new priority's lane, whose next read takes it. An entry a worker
        holds (running, or read to run next) is refused: its record must name the lane
        its entry is in. A concurrency is taken as it is: one sub-request runs one at a
        time whatever the limit."""
        for rec in self._records():
            _check_live(self.job_id, rec["state"])
            if priority is None:
                return
            try:
                code = self.q.scripts.lane_reprioritize(
                    self.shard, (int(rec["priority"]), str(rec["client"])), priority,
                    self.job_id)
            except ScriptError as e:
                if e.code != ScriptErrorCode.JOB_FINISHED:
                    raise
                continue  # it ended meanwhile: read again, which says so
            if code == 2:
                raise ConfigError(f"job {self.job_id!r} is running (a worker holds its one "
                                  "sub-request, running it or about to): a small job's "
                                  "priority changes while it waits, not while it runs")
            if code != 3:  # else its record named another lane: changed meanwhile
                return


    def delete(self) -> None:
        rec = self._record()  # (its lane: a finished job's record no longer moves)
        self.q.scripts.lane_delete(self.shard, (int(rec["priority"]), str(rec["client"])),
                                   self.job_id)

    def retry(self, token: str) -> int:
        raw: Any = self.q.redis.hget(self.shard.ljobs, self.job_id)
        if raw is None:
            raise JobNotFound(self.job_id)
        return retrying.retry_lane(self.q, self.shard, self.job_id, lane.parse(raw, self.shard.tag),
                                   raw.decode("utf-8", "replace"), token)


def _settings(text: list[Any]) -> JobSettings:
    """Settings from the stored texts (priority, client, max_deliveries, timeout), the
    defaults where one is missing."""
    d = JobSettings()
    return JobSettings(int(text[0]) if text[0] is not None else d.priority,
                       str(text[1]) if text[1] else d.client,
                       int(text[2]) if text[2] else d.max_deliveries,
                       int(text[3] or 0))


def noted_cancels(client: Any, qk: QueueKeys, workers: Sequence[str]) -> list[set[str]]:
    """The jobs each of ``workers``' hashes on shard ``qk`` lists as cancels its beat
    noted (``cancels``: what a cancel waits for), in one round trip."""
    if not workers:
        return []
    pipe = client.pipeline(transaction=False)
    for worker in workers:
        pipe.hget(qk.worker(worker), "cancels")
    return [set((noted or b"").decode().split(",")) - {""} for noted in pipe.execute()]


def _unlisted(q: JobHome, qk: QueueKeys, workers: list[str], job_id: str) -> list[str]:
    """Those of live ``workers`` whose hash does not list ``job_id`` among the cancels
    their beat noted (``cancels``)."""
    return [w for w, noted in zip(workers, noted_cancels(q.redis, qk, workers))
            if job_id not in noted]


def _check_live(job_id: str, state: Any) -> None:
    """Raise ConfigError unless the meta ``state`` read is a live one (open, active)."""
    name = state.decode() if isinstance(state, bytes) else str(state)
    if name not in ("open", "active"):
        raise ConfigError(f"job {job_id!r} is {name}: there is nothing to re-prioritize")
