"""The scripts of one job's hash slot: create, add, finalize, ack, fail, recover, abort."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from streamq.base.config import GROUP
from streamq.base.keys import JobKeys
from streamq.base.replies import (
    AckReply,
    Call,
    CreateReply,
    JobReply,
    PromoteReply,
    ScriptErrorCode,
    new_token,
    raise_for_code,
    s,
)
from streamq.errors import RowConflict, TotalMismatch, WriteConflict
from streamq.model.script_base import ScriptsBase
from streamq.services import tracing


class JobScripts(ScriptsBase):
    """Job-slot scripts (keys of :class:`streamq.keys.JobKeys`)."""


    @staticmethod
    def create_job_call(
        jk: JobKeys,
        *,
        queue: str,
        priority: int,
        concurrency: int,
        client: str,
        max_deliveries: int,
        retention_ms: int,
        dedup: str,
        mode: str,
        entries: Iterable[tuple[bytes, bytes]],
        token: str | None = None,
        when: str = "",
        timeout_ms: int = 0,
    ) -> Call:
        """``mode`` is "final", "open" or "submit"; ``when`` is "" (ready now),
        "+<ms>" or "@<epoch ms>" (a scheduled job); ``timeout_ms`` each handler run's
        limit (0: none); see create_job-6.lua."""
        return JobScripts.create_job_calls(
            [(jk, entries)], queue=queue, priority=priority, concurrency=concurrency,
            client=client, max_deliveries=max_deliveries,
            retention_ms=retention_ms, mode=mode, dedup=dedup, token=token, when=when,
            timeout_ms=timeout_ms)[0]

    @staticmethod
    def create_job_calls(
        jobs: Iterable[tuple[JobKeys, Iterable[tuple[bytes, bytes]]]],
        *,
        queue: str,
        priority: int,
        concurrency: int,
        client: str,
        max_deliveries: int,
        retention_ms: int,
        mode: str,
        dedup: str = "",
        token: str | None = None,
        when: str = "",
        timeout_ms: int = 0,
    ) -> list[Call]:
        """:meth:`create_job_call` for many jobs with the same settings (their arguments
        share one head).

        The head carries the calls' incarnation, ``token`` (a fresh random one when not
        given): it only has to differ between two creations of the same job id, and the
        jobs of one batch have distinct ids. A resent call carries the same one, which
        is how create_job tells its own resend (it replies as the creator) from another
        create of the id; a job that exists keeps its own."""
        head: list[Any] = [queue, priority, concurrency, client, max_deliveries,
                           token or new_token(), retention_ms, dedup, mode, GROUP, when,
                           timeout_ms]
        trace = tracing.entry_context() if tracing.ACTIVE else ""
        calls = []
        for jk, entries in jobs:
            args = head.copy()
            for kind, data in entries:
                args.append(kind)
                args.append(data)
            if trace:
                args.append(trace)
            calls.append(Call("create_job", (jk.meta, jk.tasks, jk.results, jk.errors, jk.dlq,
                                             jk.retry), args))
        return calls

    @staticmethod
    def parse_create(r: Sequence[Any] | int) -> CreateReply:
        if isinstance(r, int):  # an error code (ERR_AT_PAST): nothing was created
            raise_for_code("create_job", r)
            raise ValueError(f"create_job replied {r!r}")
        return CreateReply(bool(r[0]), s(r[1]), JobReply.parse(r[2:]))

    def add_tasks(
        self, jk: JobKeys, entries: Sequence[tuple[bytes, bytes]], expect_total: int | None = None,
        batch_id: str | None = None,
    ) -> int:
        """Append sub-requests to an open job; return the index after the last one added
        (the job's total right after this call).

        With ``expect_total`` nothing is added unless the job has exactly that
        many sub-requests (raises ScriptError TOTAL_MISMATCH otherwise). The call
        is idempotent by ``batch_id`` (one is drawn when not given): sent again
        after a lost reply, it adds nothing and returns what the first call did.
        """
        args: list[Any] = ["" if expect_total is None else expect_total, batch_id or new_token()]
        for kind, data in entries:
            args += [kind, data]
        if tracing.ACTIVE and (trace := tracing.entry_context()):
            args.append(trace)
        reply = self.run("add_tasks", (jk.meta, jk.tasks, jk.batches, jk.retry), args)
        raise_for_code("add_tasks", reply, jk.job_id)
        return int(reply)

    def reprioritize_job(self, jk: JobKeys, priority: int | None,
                         concurrency: int | None) -> tuple[int, int]:
        """Store a job's new priority and/or concurrency in its meta; returns both as
        stored. Raises JobNotFound, or ScriptError JOB_FINISHED for a terminal job.
        See reprioritize_job-1.lua."""
        reply = self.run("reprioritize_job", (jk.meta,),
                         ("" if priority is None else priority,
                          "" if concurrency is None else concurrency))
        raise_for_code("reprioritize_job", reply, jk.job_id)
        return int(reply[0]), int(reply[1])

    def finalize_job(self, jk: JobKeys, token: str | None = None) -> JobReply:
        """Close an open job; completion may follow at once (``completed``: finish it).

        Idempotent by ``token`` (one is drawn when not given): sent again after a
        lost reply, it changes nothing and still says ``completed`` when the job is
        terminal, so the caller finishes it (a no-op when finished already)."""
        reply = self.run("finalize_job", (jk.meta, jk.tasks, jk.results, jk.errors, jk.dlq),
                         (token or new_token(), "", ""))
        raise_for_code("finalize_job", reply, jk.job_id)
        return JobReply.parse(reply)

    @staticmethod
    def ack_call(jk: JobKeys, done: Sequence[tuple[str, int, bytes]]) -> Call:
        # done holds (entry id, index, result) triples: ARGV's order
        args: list[Any] = [GROUP, *itertools.chain.from_iterable(done)]
        return Call("ack", (jk.tasks, jk.meta, jk.results, jk.errors, jk.inflight, jk.dlq), args)

    @staticmethod
    def parse_ack(r: Sequence[Any]) -> AckReply:
        return AckReply(int(r[0]), JobReply.parse(r[1:]))

    def delete_job(self, jk: JobKeys) -> None:
        """Delete a finished job's records now; JobNotFound for no job, ConfigError for
        one not finished. See delete_job-11.lua."""
        r = self.run("delete_job", (jk.meta, jk.tasks, jk.results, jk.errors, jk.retry,
                                    jk.inflight, jk.dlq, jk.unannounced, jk.batches, jk.added,
                                    jk.ids), ())
        raise_for_code("delete_job", r, jk.job_id)

    def retry_job(self, jk: JobKeys, token: str, indexes: Sequence[int]) -> tuple[int, JobReply]:
        """Re-run the dead-lettered sub-requests ``indexes`` of a failed or partial job in
        place, under the new incarnation ``token``: (how many went back, the job).
        JobNotFound, or ConfigError for a job not finished or with nothing to retry.
        See retry_job-6.lua."""
        r = self.run("retry_job", (jk.meta, jk.tasks, jk.results, jk.errors, jk.dlq,
                                   jk.unannounced), (GROUP, token, *indexes))
        raise_for_code("retry_job", r, jk.job_id)
        return int(r[0]), JobReply.parse(r[1:])

    @staticmethod
    def requeue_call(jk: JobKeys, consumer: str, entry_ids: Sequence[str]) -> Call:
        """Hand back entries ``consumer`` read but never started; replies how many moved
        (none of a cancelled job: those are dropped). See requeue-2.lua."""
        return Call("requeue", (jk.tasks, jk.meta), [GROUP, consumer, *entry_ids])

    def requeue(self, jk: JobKeys, consumer: str, entry_ids: Sequence[str]) -> int:
        """:meth:`requeue_call`, run; how many moved."""
        call = self.requeue_call(jk, consumer, entry_ids)
        return int(self.run(call.name, call.keys, call.args))

    # -- recovery -----------------------------------------------------------------

    @staticmethod
    def fail_call(
        jk: JobKeys,
        *,
        entry_id: str,
        index: int,
        attempts: int,
        delay_ms: int,
        error: str,
        kind: bytes,
        payload: bytes,
        trace: str = "",
    ) -> Call:
        """A failed attempt: retry ``delay_ms`` after Redis's clock now, or (delay -1, or
        attempts used up) dead-letter. ``trace``: the entry's trace context, which its
        retry carries (streamq.tracing)."""
        args: tuple[Any, ...] = (GROUP, entry_id, index, attempts, delay_ms, error, kind, payload)
        return Call("fail", (jk.tasks, jk.meta, jk.results, jk.errors, jk.retry, jk.inflight,
                             jk.dlq, jk.unannounced), (*args, trace) if trace else args)

    @staticmethod
    def parse_fail(r: Sequence[Any]) -> tuple[int, JobReply]:
        """(outcome: 0 settled already, 1 retry scheduled, 2 dead-lettered; the job)."""
        return int(r[0]), JobReply.parse(r[1:])

    def promote_retries(self, jk: JobKeys, limit: int = 1000) -> tuple[int, int]:
        """Move due retries back into the stream; return (moved, ms until the next
        retry is due by Redis's clock, or -1 when none waits)."""
        r = self.promote_retries_full(jk, limit)
        return r.moved, r.wait_ms

    @staticmethod
    def promote_retries_call(jk: JobKeys, limit: int = 1000) -> Call:
        """Move due retries back into the stream (reply: :meth:`parse_promote`)."""
        return Call("promote_retries", (jk.retry, jk.tasks, jk.meta), (limit,))

    @staticmethod
    def parse_promote(r: Sequence[Any]) -> PromoteReply:
        return PromoteReply(int(r[0]), int(r[1]), int(r[2]))

    def promote_retries_full(self, jk: JobKeys, limit: int = 1000) -> PromoteReply:
        """Move due retries back into the stream; return all the script tells."""
        call = self.promote_retries_call(jk, limit)
        return self.parse_promote(self.run(call.name, call.keys, call.args))

    def reclaim(
        self, jk: JobKeys, *, consumer: str, min_idle_ms: int, cursor: str, count: int,
        max_deliveries: int = 0,
    ) -> tuple[str, int, int, JobReply]:
        """One XAUTOCLAIM slice of stalled entries; return (cursor, re-added, dead, job)."""
        r = self.run("reclaim", (jk.tasks, jk.meta, jk.results, jk.errors, jk.inflight, jk.dlq,
                                 jk.unannounced),
                     (GROUP, consumer, min_idle_ms, cursor, count, max_deliveries))
        return s(r[0]), int(r[1]), int(r[2]), JobReply.parse(r[3:])

    def record_start(self, jk: JobKeys, entry_id: str, consumer: str) -> bool:
        """Record the start of a suspect entry; False when it is settled already."""
        return bool(self.run("record_start", (jk.tasks, jk.inflight, jk.meta),
                             (entry_id, consumer)))

    def delete_consumers(self, jk: JobKeys | str, names: Sequence[str], min_idle_ms: int
                         ) -> int:
        """Delete those of ``names`` that have nothing pending and were idle at least
        ``min_idle_ms``, each checked in the same call; return how many were deleted.
        ``jk`` is a job, or the key of a stream (a small-job lane's)."""
        if not names:
            return 0
        stream = jk if isinstance(jk, str) else jk.tasks
        return int(self.run("delete_consumers", (stream,), [GROUP, min_idle_ms, *names]))

    def expire_orphan(self, jk: JobKeys, retention_ms: int) -> int:
        """Give the keys of a job without meta a lifetime; return how many had none."""
        return int(self.run("expire_orphan", (jk.meta, jk.tasks, jk.results, jk.errors, jk.retry,
                                              jk.inflight, jk.dlq, jk.unannounced, jk.added,
                                              jk.ids), (retention_ms,)))

    # -- keyed (fenced, idempotent) adds and abort: the Spark writer ----------------

    @staticmethod
    def add_keyed_call(jk: JobKeys, keep_ms: int, token: str, partition: int, attempt: int,
                       entries: Sequence[tuple[str, str, bytes, bytes]]) -> Call:
        """Add sub-requests of one write's task under ids derived from their rows,
        skipping ids added before with the same digest by the same partition.

        ``entries`` are ``(id, digest, type letter, payload)``, at most ``ADD_CHUNK``,
        ids distinct; ``token`` is the write token that opened the job; ``keep_ms``
        is the lifetime of the id maps; see add_keyed-4.lua.
        """
        args: list[Any] = [keep_ms, token, partition, attempt]
        for sub_id, digest, kind, data in entries:
            args += [sub_id, digest, kind, data]
        return Call("add_keyed", (jk.meta, jk.tasks, jk.added, jk.ids), args)

    @staticmethod
    def parse_add_keyed(reply: Any, job_id: str) -> tuple[int, int, int]:
        """(added, skipped, new total); raises JobNotFound / JobClosed / WriteConflict /
        RowConflict on error codes."""
        if isinstance(reply, list) and reply and int(reply[0]) < 0:
            code, sub_id, owner = int(reply[0]), s(reply[1]), s(reply[2])
            if code == ScriptErrorCode.ROW_CHANGED:
                raise RowConflict(
                    f"job {job_id!r}: the row with id {sub_id!r} differs from the one "
                    f"partition {owner} added before: the input changed between task "
                    "attempts, so the write cannot add each row exactly once")
            raise RowConflict(
                f"job {job_id!r}: id {sub_id!r} was added by partition {owner} already: "
                "two rows have this id (a keyColumn that is not unique, or rows that "
                "moved between partitions on a retry)")
        if reply == ScriptErrorCode.NOT_WRITER:
            raise WriteConflict(f"job {job_id!r} was opened by another write: only the "
                                "write that opened a job adds to it")
        raise_for_code("add_keyed", reply, job_id)
        return int(reply[0]), int(reply[1]), int(reply[2])

    def add_keyed(self, jk: JobKeys, keep_ms: int, token: str, partition: int, attempt: int,
                  entries: Sequence[tuple[str, str, bytes, bytes]]) -> tuple[int, int, int]:
        """Run :meth:`add_keyed_call` now; return (added, skipped, new total)."""
        call = self.add_keyed_call(jk, keep_ms, token, partition, attempt, entries)
        return self.parse_add_keyed(self.run(call.name, call.keys, call.args), jk.job_id)

    def commit_write(self, jk: JobKeys, token: str, expected_total: int) -> JobReply:
        """Finalize a job that write ``token`` opened, if it holds exactly
        ``expected_total`` sub-requests (WriteConflict for another write's job,
        TotalMismatch, changing nothing, for another total). Idempotent: the closer
        token is the write token, so a commit sent again is a no-op that still says
        ``completed`` when the job is terminal."""
        reply = self.run("finalize_job", (jk.meta, jk.tasks, jk.results, jk.errors, jk.dlq),
                         (token, token, expected_total))
        if isinstance(reply, list) and reply and int(reply[0]) == ScriptErrorCode.TOTAL_MISMATCH:
            raise TotalMismatch(jk.job_id, expected_total, int(reply[1]))
        if reply == ScriptErrorCode.NOT_WRITER:
            raise WriteConflict(f"job {jk.job_id!r} was opened by another write")
        raise_for_code("finalize_job", reply, jk.job_id)
        return JobReply.parse(reply)

    def commit_batch(self, jk: JobKeys, token: str, batch: int, produced: int) -> bool:
        """Commit a micro-batch into a streaming query's one open job (see
        commit_batch-1.lua); True if committed now, False if committed before.
        TotalMismatch (nothing changed) when the job holds another number of
        sub-requests than the batches committed so far produced."""
        reply = self.run("commit_batch", (jk.meta,), (token, batch, produced))
        if isinstance(reply, list) and reply and int(reply[0]) == ScriptErrorCode.TOTAL_MISMATCH:
            raise TotalMismatch(jk.job_id, int(reply[2]), int(reply[1]))
        if reply == ScriptErrorCode.NOT_WRITER:
            raise WriteConflict(f"job {jk.job_id!r} was opened by another query or write")
        raise_for_code("commit_batch", reply, jk.job_id)
        return bool(reply)

    def abort_job(self, jk: JobKeys, reason: str, token: str | None = None, *,
                  write_token: str = "") -> JobReply:
        """Make an open or active job ``aborted`` (terminal); ``completed`` says this call did it
        (also when it is sent again after a lost reply: idempotent by ``token``, drawn
        when not given). With ``write_token``, only a job that write opened and has not
        committed is aborted; any other job is left as it is."""
        reply = self.run("abort_job", (jk.meta, jk.tasks, jk.results, jk.errors, jk.retry,
                                       jk.inflight, jk.added, jk.ids, jk.dlq, jk.unannounced),
                         (reason, token or new_token(), write_token))
        raise_for_code("abort_job", reply, jk.job_id)
        return JobReply.parse(reply)

    def cancel_job(self, jk: JobKeys, token: str) -> tuple[int, JobReply]:
        """Make an open or active job ``cancelled`` (terminal): (entries workers still
        hold, the job's reply); ``completed`` says this call (or an earlier one with the
        same ``token``) cancelled it. See cancel_job-10.lua."""
        reply = self.run("cancel_job", (jk.meta, jk.tasks, jk.results, jk.errors, jk.retry,
                                        jk.inflight, jk.added, jk.ids, jk.dlq, jk.unannounced),
                         (GROUP, token))
        raise_for_code("cancel_job", reply, jk.job_id)
        return int(reply[0]), JobReply.parse(reply[1:])

    def expire_keyed(self, jk: JobKeys) -> int:
        """Give a terminal job's id maps the job's remaining lifetime; return it (ms) or 0."""
        reply = self.run("expire_keyed", (jk.meta, jk.added, jk.ids), ())
        raise_for_code("expire_keyed", reply, jk.job_id)
        return int(reply)
