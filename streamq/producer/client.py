"""The producer side: submit jobs, stream sub-requests, read status and results."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from streamq.base import config
from streamq.base.codec import encode
from streamq.base.keys import QueueKeys, check_client, check_name, shard_queue
from streamq.base.members import new_job_id, new_job_ids
from streamq.base.models import JobState
from streamq.errors import ConfigError, DeadLetterReplayed, JobNotFound, StreamqError
from streamq.model.scripts import JobReply
from streamq.producer import deadletters, lane
from streamq.producer.connected import Connected
from streamq.producer.controls import Controls, check_range
from streamq.producer.creating import LIVE as _LIVE
from streamq.producer.creating import Creating
from streamq.producer.deadletters import DeadLetter
from streamq.producer.following import Following
from streamq.producer.job_store import JobSettings, find_job, reused_small
from streamq.producer.jobs import Job, StreamingJob, outlasting, wrap_connection_errors
from streamq.services import schedule
from streamq.services.shards import load_shards, read_shards, shard_index
from streamq.services.tracing import submit_tracer, traced_submit
from streamq.services.watchdog import timeout_ms
from streamq.storage.connection import Client

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["Job", "Queue", "StreamingJob", "now_ms"]

def now_ms() -> int:
    return int(time.time() * 1000)


_check_range = check_range


class Queue(Following, Controls, Creating, Connected):
    """A client of one queue: submit jobs and follow them.

    ``Queue("images", "redis://localhost:6379/0")``; pass ``client=`` to share
    a redis-py client instead of a URL.
    """

    def __init__(
        self,
        name: str,
        url: str | None = None,
        *,
        client: Client | None = None,
        retention_s: float = config.DEFAULT_RETENTION_S,
        max_payload_bytes: int = config.DEFAULT_MAX_PAYLOAD_BYTES,
        events_maxlen: int = config.DEFAULT_EVENTS_MAXLEN,
        shards: int | None = None,
        tracing: bool | TracerProvider | None = None,
    ) -> None:
        """``tracing``: OpenTelemetry spans for submits and trace context in the entries
        (None: as ``STREAMQ_TRACING`` says, else on when a tracer provider is set; see
        :mod:`streamq.tracing`)."""
        self.name = check_name("queue name", name)
        if client is None:
            if url is None:
                url = config.redis_url_from_env()
        Connected.__init__(self, url, client)  # Redis is asked on first use
        #: the queue's first shard (its only one on one server)
        self.keys = QueueKeys(name)
        self._shards_wanted = shards
        self._shards: list[QueueKeys] | None = None
        if retention_s <= 0:
            raise ConfigError("retention_s must be positive")
        self.retention_ms = int(retention_s * 1000)
        self.max_payload_bytes = max_payload_bytes
        self.events_maxlen = events_maxlen
        #: one-entry jobs with a generated id and no dedup key ride the small-job lane
        self.lane = lane.enabled()
        #: spans around submits (streamq.tracing); None when tracing is off
        self.tracer = submit_tracer(tracing)

    @property
    def shards(self) -> list[QueueKeys]:
        """The queue's shards (:mod:`streamq.shards`), read (or chosen: the first use
        stores them) once."""
        if self._shards is None:
            self._shards = load_shards(self.redis, self.name, self._shards_wanted)
        return self._shards

    @property
    def known_shards(self) -> list[QueueKeys]:
        """The queue's shards as stored, for reading: writes nothing (a queue with no
        stored shards has its first one only, and is asked again next time)."""
        if self._shards is None:
            stored = read_shards(self.redis, self.name)
            if stored is None:
                return [self.keys]
            self._shards = stored
        return self._shards

    def shard_for(self, job_id: str, dedup_key: str | None = None) -> QueueKeys:
        """The shard a new job goes to: its dedup key's, else its id's."""
        shards = self.shards
        return shards[shard_index(dedup_key or job_id, len(shards))]

    def job_shard(self, job_id: str) -> QueueKeys:
        """The shard job ``job_id`` lives on (its meta ``queue``; the first for a job
        that is gone or of another queue)."""
        tag: Any = self.redis.hget(self.keys.job(job_id).meta, "queue")
        if tag is None or shard_queue(tag.decode()) != self.name:
            return self.keys
        return self.shard_of(tag.decode())

    def shard_of(self, tag: str) -> QueueKeys:
        """The shard of hash tag ``tag`` (a job's meta ``queue`` field)."""
        for qk in self.known_shards:
            if qk.tag == tag:
                return qk
        return QueueKeys(self.name, tag)  # a well-formed tag of this queue

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submitting ----------------------------------------------------------------

    def _encode_all(self, payloads: Iterable[Any]) -> list[tuple[bytes, bytes]]:
        if isinstance(payloads, (str, bytes, bytearray, dict)):
            raise ConfigError("payloads must be a list of payloads, not a single value")
        out = []
        for i, p in enumerate(payloads):
            try:
                out.append(encode(p, self.max_payload_bytes))
            except Exception as e:
                raise type(e)(f"sub-request {i}: {e}") from None
        return out

    def _options(
        self, priority: int, concurrency: int, client: str, max_deliveries: int
    ) -> None:
        _check_range("priority", priority, 0, config.MAX_PRIORITY)
        _check_range("concurrency", concurrency, 1, config.MAX_CONCURRENCY)
        _check_range("max_deliveries", max_deliveries, 1, 1000)
        check_client(client)

    def _job_id(self, job_id: str | None, dedup_key: str | None) -> tuple[str, bool]:
        """The id of the job to create (a dedup key's holder when one holds it), and
        whether a small job of that id is kept (:func:`reused_small`: it is the job)."""
        given = job_id is not None
        job_id = check_name("job id", job_id) if job_id is not None else new_job_id()
        if dedup_key is not None:
            if not isinstance(dedup_key, str) or not dedup_key or len(dedup_key) > 512:
                raise ConfigError("dedup_key must be a non-empty string of at most 512 characters")
            held = self.scripts.reserve_dedup(self.shard_for(job_id, dedup_key), dedup_key,
                                              job_id)
            given, job_id = given or held != job_id, held  # (a new id names no job)
        return job_id, given and reused_small(self, job_id, dedup_key)

    @traced_submit("submit")
    @wrap_connection_errors
    def submit(
        self,
        payloads: Iterable[Any],
        *,
        job_id: str | None = None,
        priority: int = config.DEFAULT_PRIORITY,
        concurrency: int = config.DEFAULT_CONCURRENCY,
        client: str = config.DEFAULT_CLIENT,
        max_deliveries: int = config.DEFAULT_MAX_DELIVERIES,
        dedup_key: str | None = None,
        delay: float | None = None,
        at: datetime | None = None,
        timeout: float | None = None,
    ) -> Job:
        """Submit one job whose sub-requests are ``payloads`` (bytes, str or JSON values).

        Every payload is validated before anything is sent: a bad one raises
        PayloadError (or PayloadTooLarge) and enqueues nothing. An existing
        ``job_id`` (a small job's too, until its retention passed), or a
        ``dedup_key`` already seen, returns the existing job (``job.created`` is
        False) and enqueues nothing.

        ``delay`` (seconds) or ``at`` (a timezone-aware datetime) schedules the job:
        it is stored now, its status is ``scheduled``, and its sub-requests become
        ready at that time by Redis's clock (workers promote them). An ``at`` already
        past raises ConfigError and submits nothing.

        ``timeout`` (seconds) bounds each run of the handler on one of its
        sub-requests: a run past it counts a failed attempt (retried with backoff,
        dead-lettered after ``max_deliveries``); see :mod:`streamq.watchdog`. A job
        with a timeout never rides the small-job lane.
        """
        self._options(priority, concurrency, client, max_deliveries)
        limit = timeout_ms(timeout)
        when = schedule.when(delay, at)
        entries = self._encode_all(payloads)
        if when:
            schedule.check_future(self.redis, at, self.keys.active)
        if (self.lane and not when and not limit and job_id is None and dedup_key is None
                and len(entries) == 1):
            # a small job rides its shard's lane: one script, one round trip
            jid = new_job_id()
            lane.submit(self, [(jid, entries[0])], priority, client, max_deliveries)
            return Job(self, jid)
        jid, small = self._job_id(job_id, dedup_key)
        if small:
            return Job(self, jid, created=False)
        first, rest = entries[: config.ADD_CHUNK], entries[config.ADD_CHUNK :]
        qk = self.shard_for(jid, dedup_key)
        call = self._create_call(jid, priority, concurrency, client, max_deliveries,
                                 dedup_key or "", first, "submit" if rest else "final", qk=qk,
                                 when=when, timeout_ms=limit)
        created = self._create(jid, call, dedup_key, qk)
        qk = self._check_queue(jid, created.queue)
        reply = created.job
        if reply.state == JobState.OPEN.value and (
            created.created or self.redis.hget(self.keys.job(jid).meta, "mode") == b"submit"
        ):
            # a plain submit adds the rest, fenced by the job's total, so a retried
            # submit of the same job id resumes where an interrupted one stopped
            reply = self._add_rest_and_finalize(jid, entries, reply.total)
        self._settle_created(jid, reply, qk)
        return Job(self, jid, created=created.created)

    @traced_submit("submit_many")
    @wrap_connection_errors
    def submit_many(
        self,
        jobs: Sequence[Iterable[Any]],
        *,
        priority: int = config.DEFAULT_PRIORITY,
        concurrency: int = config.DEFAULT_CONCURRENCY,
        client: str = config.DEFAULT_CLIENT,
        max_deliveries: int = config.DEFAULT_MAX_DELIVERIES,
        timeout: float | None = None,
    ) -> list[Job]:
        """Submit many jobs, pipelined: one round trip for any number of one-entry jobs
        (the small-job lane, :mod:`streamq.lane`), two for other small jobs.

        Job ids are generated. Every payload of every job is validated first.
        A job of more than ``ADD_CHUNK`` sub-requests is submitted on its own.
        ``timeout`` is :meth:`submit`'s, for every job (none rides the lane then).
        """
        self._options(priority, concurrency, client, max_deliveries)
        limit = timeout_ms(timeout)
        encoded = [self._encode_all(p) for p in jobs]
        laned = [i for i, e in enumerate(encoded) if self.lane and not limit and len(e) == 1]
        lane_ids = dict(zip(laned, new_job_ids(len(laned))))
        if lane_ids:
            lane.submit(self, [(lane_ids[i], encoded[i][0]) for i in laned], priority, client,
                        max_deliveries)
        small = [i for i, e in enumerate(encoded)
                 if len(e) <= config.ADD_CHUNK and i not in lane_ids]
        ids = dict(zip(small, new_job_ids(len(small))))
        shards = self.shards
        by_shard: dict[int, list[int]] = {}
        for i in small:
            by_shard.setdefault(shard_index(ids[i], len(shards)), []).append(i)
        order = [i for group in by_shard.values() for i in group]
        calls = [call for k, group in by_shard.items() for call in self.scripts.create_job_calls(
            ((self.keys.job(ids[i]), encoded[i]) for i in group), queue=shards[k].tag,
            priority=priority, concurrency=concurrency, client=client,
            max_deliveries=max_deliveries, retention_ms=self.retention_ms, mode="final",
            timeout_ms=limit)]
        # the intents go first (see _create and _intent_then)
        intents = [self.scripts.intend_jobs_call(shards[k], [ids[i] for i in group])
                   for k, group in by_shard.items()]
        created = self._intent_then(intents, calls) if ids else []
        to_register: dict[int, list[tuple[str, JobReply]]] = {}
        for i, raw in zip(order, created):
            rep = self.scripts.parse_create(raw).job
            k = shard_index(ids[i], len(shards))
            if rep.completed:
                self._finish(ids[i], rep, shards[k])
            else:
                to_register.setdefault(k, []).append((ids[i], rep))
        for k, jobs_k in to_register.items():
            self.register(jobs_k, shards[k])
        handles: list[Job] = []
        for i, entries in enumerate(encoded):
            if i in lane_ids:
                handles.append(Job(self, lane_ids[i]))
            elif i in ids:
                handles.append(Job(self, ids[i]))
            else:
                handles.append(self._submit_encoded(entries, priority, concurrency, client,
                                                    max_deliveries, limit))
        return handles

    def _submit_encoded(self, entries: list[tuple[bytes, bytes]], priority: int,
                        concurrency: int, client: str, max_deliveries: int,
                        limit: int = 0) -> Job:
        jid = new_job_id()
        qk = self.shard_for(jid)
        call = self._create_call(jid, priority, concurrency, client, max_deliveries, "",
                                 entries[: config.ADD_CHUNK], "submit", qk=qk, timeout_ms=limit)
        created = self._create(jid, call, None, qk)
        reply = self._add_rest_and_finalize(jid, entries, created.job.total)
        self._settle_created(jid, reply, qk)
        return Job(self, jid)

    @wrap_connection_errors
    def open(
        self,
        *,
        job_id: str | None = None,
        priority: int = config.DEFAULT_PRIORITY,
        concurrency: int = config.DEFAULT_CONCURRENCY,
        client: str = config.DEFAULT_CLIENT,
        max_deliveries: int = config.DEFAULT_MAX_DELIVERIES,
        dedup_key: str | None = None,
        token: str | None = None,
        timeout: float | None = None,
    ) -> StreamingJob:
        """Open a streaming job: add sub-requests, then finalize.

        Its counter of unfinished sub-requests starts at 1, so it cannot
        complete before :meth:`StreamingJob.finalize`, however fast workers are.
        ``token`` becomes the job's incarnation when this call creates it (a fresh
        one when not given): an open sent again with the same token counts as this
        open (``created`` stays true), which is how a writer owns its job.
        ``timeout`` is :meth:`submit`'s.
        """
        self._options(priority, concurrency, client, max_deliveries)
        limit = timeout_ms(timeout)
        jid, small = self._job_id(job_id, dedup_key)
        if small:  # never open: adds raise JobClosed, as to a finalized job
            return StreamingJob(self, jid, created=False, concurrency=1,
                                shard=self.lane_shard(jid), closed=True)
        qk = self.shard_for(jid, dedup_key)
        call = self._create_call(jid, priority, concurrency, client, max_deliveries,
                                 dedup_key or "", [], "open", token, qk=qk, timeout_ms=limit)
        created = self._create(jid, call, dedup_key, qk)
        qk = self._check_queue(jid, created.queue)
        if created.job.state in _LIVE:
            self.register([(jid, created.job)], qk)
        return StreamingJob(self, jid, created=created.created, concurrency=created.job.concurrency,
                            shard=qk)

    @wrap_connection_errors
    @outlasting
    def dead_letters(self, count: int = 100, job_id: str | None = None) -> list[DeadLetter]:
        """The newest dead letters of the queue (one per job and index), newest first.

        A dead letter of shard ``k`` > 0 has the id ``<dead stream id>@<k>``."""
        out: list[DeadLetter] = []
        for k, qk in enumerate(self.known_shards):
            for d in deadletters.list_dead(self.redis, qk, count, job_id):
                out.append(dataclasses.replace(d, id=f"{d.id}@{k}") if k else d)
        out.sort(key=lambda d: tuple(int(x) for x in d.id.partition("@")[0].split("-")),
                 reverse=True)
        return out[:count]

    def _dead_shard(self, dead_id: str) -> tuple[QueueKeys, str]:
        """The shard and dead-stream id of a dead letter id (see :meth:`dead_letters`)."""
        raw, sep, k = dead_id.partition("@")
        shards = self.known_shards
        if not sep:
            return shards[0], raw
        if not k.isdigit() or not 0 < int(k) < len(shards):
            raise StreamqError(f"no dead letter {dead_id!r} in queue {self.name!r}")
        return shards[int(k)], raw

    @wrap_connection_errors
    def replay_dead(self, dead_id: str, *, token: str | None = None) -> str:
        """Put a dead letter back to work, once; return the job it went to.

        Into its own job while that job is unfinished; into a new job (same
        priority and client when known) when its job is finished or gone. A
        dead letter replayed before (by this id or a copy of it) raises
        DeadLetterReplayed; ``token`` names this replay across retries of it
        (a call retried with the same token returns the same job).
        """
        qk, raw_id = self._dead_shard(dead_id)
        try:
            dead = deadletters.get_dead(self.redis, qk, raw_id)
        except StreamqError:
            target = deadletters.replayed_into(self.redis, qk, raw_id)
            if target is None:
                raise StreamqError(f"no dead letter {dead_id!r} in queue {self.name!r}") from None
            raise DeadLetterReplayed(dead_id, target) from None
        try:  # the settings of its job, the defaults when the job is gone
            prio, client, md, timeout_ms = find_job(self, dead.job_id).settings()
        except JobNotFound:
            prio, client, md, timeout_ms = JobSettings()

        def new_job(kind: bytes, payload: bytes, jid: str) -> str:
            call = self._create_call(jid, prio, 1, client, md, "", [(kind, payload)], "final",
                                     qk=self.shard_for(jid), timeout_ms=timeout_ms)
            created = self.scripts.parse_create(self.scripts.run(call.name, call.keys, call.args))
            self._settle_created(jid, created.job, self._check_queue(jid, created.queue))
            return jid

        return deadletters.replay(self.redis, self.scripts, qk, dead, new_job, token)
