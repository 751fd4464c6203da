"""The two hash slots of a submit, the part of :class:`streamq.client.Queue` that
writes them: a job's create in its own hash slot, preceded by its intent in the queue's
shard (the durable first step the reaper finishes from), then the job's registration
in the shard, or its finish when it was terminal at once. Every step may be sent
again safely (see docs/design/job-life.md, "Submit")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamq.base import config
from streamq.base.keys import QueueKeys, shard_queue
from streamq.base.models import JobState, completion_message
from streamq.errors import JobClosed, JobConflict, ScriptError
from streamq.model.scripts import Call, CreateReply, JobReply, ScriptErrorCode
from streamq.producer.connected import Connected
from streamq.storage.cluster import is_cluster

#: the states of a job that still runs (registered in its shard)
LIVE = (JobState.OPEN.value, JobState.ACTIVE.value)


class Creating(Connected):
    """The create, register and finish steps of :class:`streamq.client.Queue`."""

    name: str
    keys: QueueKeys
    retention_ms: int
    events_maxlen: int

    def shard_for(self, job_id: str, dedup_key: str | None = None) -> QueueKeys:
        raise NotImplementedError

    def shard_of(self, tag: str) -> QueueKeys:
        raise NotImplementedError

    def _settle_created(self, jid: str, reply: JobReply, qk: QueueKeys) -> None:
        """The queue-slot step after a create: finish a job terminal at once, register
        a live one."""
        if reply.completed:
            self._finish(jid, reply, qk)
        elif reply.state in LIVE:
            self.register([(jid, reply)], qk)

    def _add_rest_and_finalize(
        self, jid: str, entries: Sequence[tuple[bytes, bytes]], total: int
    ) -> JobReply:
        jk = self.keys.job(jid)
        for start in range(total, len(entries), config.ADD_CHUNK):
            try:
                self.scripts.add_tasks(jk, entries[start : start + config.ADD_CHUNK],
                                       expect_total=start)
            except ScriptError as e:
                if e.code != ScriptErrorCode.TOTAL_MISMATCH:
                    raise
                raise JobConflict(f"job {jid!r} is being submitted by another producer") from None
            except JobClosed:
                break  # another producer finished the same submit
        return self.scripts.finalize_job(jk)

    def _create_call(self, jid: str, priority: int, concurrency: int, client: str,
                     max_deliveries: int, dedup: str, entries: Sequence[tuple[bytes, bytes]],
                     mode: str, token: str | None = None, *, qk: QueueKeys | None = None,
                     when: str = "", timeout_ms: int = 0) -> Call:
        qk = qk or self.shard_for(jid, dedup or None)
        return self.scripts.create_job_call(
            qk.job(jid), queue=qk.tag, priority=priority, concurrency=concurrency,
            client=client, max_deliveries=max_deliveries,
            retention_ms=self.retention_ms, dedup=dedup, mode=mode, entries=entries,
            token=token, when=when, timeout_ms=timeout_ms)

    def _create(self, jid: str, call: Call, dedup_key: str | None, qk: QueueKeys
                ) -> CreateReply:
        """Run a job-slot create preceded by its queue-slot intent, in one round trip.

        The intent is the durable first step of the cross-slot submit: should this
        process die before the job is registered (or finished), the reaper finds the
        intent and finishes the submit. A dedup key's reservation wrote the intent
        already (reserve_dedup)."""
        if dedup_key:
            return self.scripts.parse_create(self.scripts.run(call.name, call.keys, call.args))
        intent = self.scripts.intend_jobs_call(qk, [jid])
        return self.scripts.parse_create(self._intent_then([intent], [call])[0])

    def _intent_then(self, intents: Sequence[Call], calls: Sequence[Call]) -> list[Any]:
        """Run the queue-slot intent, then ``calls`` (job-slot creates); their replies.

        On one server both go in one round trip, in order. On a cluster a batch's
        parts on different masters run in no set order, so the intent (the durable
        first step) is a round trip of its own, acknowledged before any create runs:
        a create never lands without the intent that lets the reaper finish it."""
        if is_cluster(self.redis):
            self.scripts.run_many(intents)
            return self.scripts.run_many(calls)
        return self.scripts.run_many([*intents, *calls])[len(intents):]

    def _check_queue(self, jid: str, queue: str) -> QueueKeys:
        """The shard of job ``jid`` (its meta ``queue`` field), JobConflict when the id
        names a job of another queue."""
        if shard_queue(queue) != self.name:
            raise JobConflict(f"job id {jid!r} already names a job of queue "
                              f"{shard_queue(queue)!r}")
        return self.shard_of(queue)

    def register(self, jobs: Sequence[tuple[str, JobReply]], qk: QueueKeys | None = None
                 ) -> None:
        """The queue-slot step of a submit: register live jobs (of shard ``qk``, the
        first by default) and give them their tokens (idempotent; also removes their
        intents)."""
        qk = qk or self.keys
        for start in range(0, len(jobs), config.ADD_CHUNK):
            call = self.scripts.register_jobs_call(qk, jobs[start : start + config.ADD_CHUNK])
            self.scripts.run(call.name, call.keys, call.args)

    def finish_call(self, jid: str, reply: JobReply, qk: QueueKeys | None = None) -> Call:
        """The queue-slot step that records and announces a terminal job's completion
        (in shard ``qk``, the first by default); the call replies ``[1]`` when it
        finished the job, ``[0]`` when it was finished."""
        return self.finish_many_call([(jid, reply)], qk)

    def finish_many_call(self, jobs: Sequence[tuple[str, JobReply]],
                         qk: QueueKeys | None = None) -> Call:
        """:meth:`finish_call` for several terminal jobs of one shard (one code per job)."""
        queue = self.name
        # finished_ms 0: finish_jobs puts Redis's clock there
        return self.scripts.finish_jobs_call(
            qk or self.keys,
            [(jid, reply, completion_message(jid, queue, reply.state, reply.total, reply.done,
                                             reply.failed, 0))
             for jid, reply in jobs],
            events_maxlen=self.events_maxlen, events_retention_ms=self.retention_ms)

    def _finish(self, jid: str, reply: JobReply, qk: QueueKeys | None = None) -> bool:
        call = self.finish_call(jid, reply, qk)
        return bool(self.scripts.run(call.name, call.keys, call.args)[0])

