"""The only caller of streamq's Lua: one typed method per script.

Scripts are assembled by :mod:`streamq.luaload`, registered once per client
(EVALSHA, with a reload after NOSCRIPT), called with the key names of
:mod:`streamq.keys`, and their replies parsed into plain tuples here.
Negative integer replies are streamq's error codes, mapped to exceptions in
:func:`raise_for_code`.
"""

from __future__ import annotations

import enum
import itertools
import os
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import redis
from redis.commands.core import Script

from .config import GROUP, MAX_CONCURRENCY, WAKE_CAP
from .connection import pipelined
from .errors import JobClosed, JobNotFound, ScriptError
from .keys import JobKeys, QueueKeys, owner
from .luaload import load_all


class ScriptErrorCode(enum.IntEnum):
    """Mirror of ``lua/includes/errors.lua``."""

    JOB_NOT_FOUND = -1
    JOB_CLOSED = -2
    TOTAL_MISMATCH = -3
    JOB_FINISHED = -4
    NOT_DEAD = -5


def raise_for_code(script: str, reply: Any, job_id: str | None = None) -> None:
    """Raise the exception an error-code reply stands for; do nothing otherwise."""
    if not isinstance(reply, int) or reply >= 0:
        return
    if reply == ScriptErrorCode.JOB_NOT_FOUND and job_id is not None:
        raise JobNotFound(job_id)
    if reply == ScriptErrorCode.JOB_CLOSED:
        raise JobClosed(f"job {job_id!r} is finalized: no sub-request can be added")
    raise ScriptError(script, reply, f"error code {reply}", job_id)


def new_token() -> str:
    """A random token (64 bits, hex) naming one write, so the write resent after a lost
    reply is recognised as the same write."""
    return os.urandom(8).hex()


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class JobReply(NamedTuple):
    """A job as a job-slot script left it (a tuple: made for every job a worker acks)."""

    completed: bool  #: this call made the job terminal: finish it in the queue slot
    state: str
    total: int
    done: int
    failed: int
    concurrency: int
    dedup: str
    priority: int = 0
    client: str = ""
    created_ms: int = 0
    retention_ms: int = 0
    #: tells this job from an earlier one of the same id (create_job-5.lua)
    incarnation: str = ""
    #: dead letters the job recorded (replayed and malformed ones included): when
    #: above 0, finishing the job marks it as possibly owing announcements
    dead: int = 0

    @classmethod
    def parse(cls, r: Sequence[Any]) -> JobReply:
        return cls(r[0] == 1, _s(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]), _s(r[6]),
                   int(r[7]), _s(r[8]), int(r[9]), int(r[10]),
                   _s(r[11]) if len(r) > 11 and r[11] is not None else "",
                   int(r[12] or 0) if len(r) > 12 else 0)


class JobMeta(NamedTuple):
    """What an announce needs of a job: its state ("" when gone), retention and
    creation time (ms; with the id, it names this incarnation of the job)."""

    state: str
    retention_ms: int
    created_ms: int


class CreateReply(NamedTuple):
    created: bool
    queue: str
    job: JobReply


class AckReply(NamedTuple):
    acked: int
    job: JobReply


class SettleReply(NamedTuple):
    claimed: list[tuple[str, float]]  #: tokens claimed and their scores
    due: list[str]  #: jobs whose retries are due (taken: promote them)
    wait_ms: int  #: until the next retry is due; -1 when none waits


class PromoteReply(NamedTuple):
    moved: int  #: retries put back into the stream
    wait_ms: int  #: ms until the next waiting retry is due (0 when due already), or -1
    concurrency: int  #: the job's tokens (0 when its meta is gone)


class Call(NamedTuple):
    """One script invocation, for :meth:`Scripts.run_many`."""

    name: str
    keys: Sequence[str]
    args: Sequence[Any]


class Scripts:
    """Every Lua entry point of streamq, bound to one Redis client."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._scripts: dict[str, Script] = {}
        self._numkeys: dict[str, int] = {}
        for name, lua in load_all().items():
            self._scripts[name] = client.register_script(lua.source)
            self._numkeys[name] = lua.numkeys

    # -- plumbing -------------------------------------------------------------

    def run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run one script (EVALSHA, loading it after NOSCRIPT)."""
        return self.run_many([Call(name, keys, args)])[0]

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """Run several scripts in one pipelined round trip; replies in order.

        A script missing from the server's cache (NOSCRIPT, after a restart or
        SCRIPT FLUSH) did not run: each missing script is loaded once and the
        calls it failed are run again, in one more round trip (twice at most, in
        case the cache was flushed again meanwhile). Any other error is raised.
        """
        return self.run_then(calls)[0]

    def run_then(self, calls: Sequence[Call],
                 commands: Sequence[Sequence[Any]] = ()) -> tuple[list[Any], list[Any]]:
        """:meth:`run_many`, with plain ``commands`` sent after the scripts in the
        same round trip; returns the scripts' replies and the commands' raw replies
        (an error reply of a command is returned in its place, not raised). The
        commands run once, after the scripts' first attempt."""
        if not calls and not commands:
            return [], []
        sent = self._pipelined(calls, commands)
        replies, after = sent[: len(calls)], sent[len(calls):]
        for _ in range(2):
            missing = [i for i, r in enumerate(replies)
                       if isinstance(r, redis.exceptions.NoScriptError)]
            if not missing:
                break
            for name in dict.fromkeys(calls[i].name for i in missing):
                self.client.script_load(self._scripts[name].script)
            for i, reply in zip(missing, self._pipelined([calls[i] for i in missing])):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies, after

    def _pipelined(self, calls: Sequence[Call],
                   then: Sequence[Sequence[Any]] = ()) -> list[Any]:
        """EVALSHA each call, then the commands ``then``, in one round trip; errors are
        returned, not raised."""
        commands: list[Sequence[Any]] = []
        for c in calls:
            if len(c.keys) != self._numkeys[c.name]:
                raise ValueError(f"{c.name} takes {self._numkeys[c.name]} keys, got {len(c.keys)}")
            commands.append(("EVALSHA", self._scripts[c.name].sha, len(c.keys), *c.keys, *c.args))
        commands.extend(then)
        return pipelined(self.client, commands)

    # -- job slot ---------------------------------------------------------------

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
    ) -> Call:
        """``mode`` is "final", "open" or "submit"; see create_job-5.lua."""
        return Scripts.create_job_calls(
            [(jk, entries)], queue=queue, priority=priority, concurrency=concurrency,
            client=client, max_deliveries=max_deliveries,
            retention_ms=retention_ms, mode=mode, dedup=dedup, token=token)[0]

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
    ) -> list[Call]:
        """:meth:`create_job_call` for many jobs with the same settings (their arguments
        share one head).

        The head carries the calls' incarnation, ``token`` (a fresh random one when not
        given): it only has to differ between two creations of the same job id, and the
        jobs of one batch have distinct ids. A resent call carries the same one, which
        is how create_job tells its own resend (it replies as the creator) from another
        create of the id; a job that exists keeps its own."""
        head: list[Any] = [queue, priority, concurrency, client, max_deliveries,
                           token or new_token(), retention_ms, dedup, mode, GROUP]
        calls = []
        for jk, entries in jobs:
            args = head.copy()
            for kind, data in entries:
                args.append(kind)
                args.append(data)
            calls.append(Call("create_job", (jk.meta, jk.tasks, jk.results, jk.errors, jk.dlq),
                              args))
        return calls

    @staticmethod
    def parse_create(r: Sequence[Any]) -> CreateReply:
        return CreateReply(bool(r[0]), _s(r[1]), JobReply.parse(r[2:]))

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
        reply = self.run("add_tasks", (jk.meta, jk.tasks, jk.batches), args)
        raise_for_code("add_tasks", reply, jk.job_id)
        return int(reply)

    def finalize_job(self, jk: JobKeys, token: str | None = None) -> JobReply:
        """Close an open job; completion may follow at once (``completed``: finish it).

        Idempotent by ``token`` (one is drawn when not given): sent again after a
        lost reply, it changes nothing and still says ``completed`` when the job is
        terminal, so the caller finishes it (a no-op when finished already)."""
        reply = self.run("finalize_job", (jk.meta, jk.tasks, jk.results, jk.errors, jk.dlq),
                         (token or new_token(),))
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

    # -- queue slot -------------------------------------------------------------

    @staticmethod
    def register_jobs_call(qk: QueueKeys, jobs: Sequence[tuple[str, JobReply]]) -> Call:
        """Register jobs (id and the job's own settings); see register_jobs-6.lua."""
        args: list[Any] = [WAKE_CAP]
        for job_id, job in jobs:
            args += [job_id, job.priority, job.client, job.concurrency, job.incarnation,
                     job.dedup]
        return Call("register_jobs",
                    (qk.active, qk.finished, qk.tokens, qk.ready, qk.fair, qk.wake, qk.creating),
                    args)

    @staticmethod
    def intend_jobs_call(qk: QueueKeys, intents: Sequence[str]) -> Call:
        """Record intents (:func:`streamq.keys.intent`) ahead of their job-slot creates;
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
             qk.retries, qk.worker(worker)),
            args,
        )

    @staticmethod
    def parse_settle(reply: Sequence[Any]) -> SettleReply:
        """The claimed tokens and their scores, the jobs whose retries are due, and the
        ms until the next retry is due (-1: none waits)."""
        claimed, due, wait = reply
        return SettleReply([(_s(claimed[i]), float(claimed[i + 1]))
                            for i in range(0, len(claimed), 2)],
                           [_s(j) for j in due], int(wait))

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
        """Note in the queue's slot that ``job_id`` has a retry due in ``delay_ms``."""
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
        about ``events_maxlen``."""
        args: list[Any] = [events_maxlen, events_retention_ms, qk.channel, qk.job_channel("")]
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
    ) -> list[str]:
        """Refresh a worker's heartbeat (alive for ``heartbeat_ttl_ms`` from Redis's clock)
        and the leases its slots hold, given as (token, slot), extended by ``lease_ms``;
        return the tokens no longer held by that slot."""
        args: list[Any] = [worker, heartbeat_ttl_ms, lease_ms, info_ttl_ms, len(info)]
        for k, v in info.items():
            args += [k, v]
        for tok, slot in tokens:
            args += [tok, owner(worker, slot)]
        reply = self.run("heartbeat", (qk.workers, qk.worker(worker), qk.leased, qk.owners), args)
        return [_s(t) for t in reply]

    def reserve_dedup(self, qk: QueueKeys, dedup_key: str, job_id: str) -> str:
        """Reserve ``dedup_key`` for ``job_id``; return the job that holds it."""
        return _s(self.run("reserve_dedup", (qk.dedup, qk.dedup_expiry, qk.creating),
                           (dedup_key, job_id)))

    def requeue(self, jk: JobKeys, consumer: str, entry_ids: Sequence[str]) -> int:
        """Hand back entries ``consumer`` read but never started; return how many moved."""
        return int(self.run("requeue", (jk.tasks,), [GROUP, consumer, *entry_ids]))

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
    ) -> Call:
        """A failed attempt: retry ``delay_ms`` after Redis's clock now, or (delay -1, or
        attempts used up) dead-letter."""
        return Call("fail", (jk.tasks, jk.meta, jk.results, jk.errors, jk.retry, jk.inflight,
                             jk.dlq, jk.unannounced),
                    (GROUP, entry_id, index, attempts, delay_ms, error, kind, payload))

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
        return _s(r[0]), int(r[1]), int(r[2]), JobReply.parse(r[3:])

    def replay(self, jk: JobKeys, index: int, serial: int, created_ms: int = 0) -> None:
        """Put dead letter ``serial`` back into its unfinished job, the one created at
        ``created_ms`` (0: any); raises on error codes."""
        reply = self.run("replay", (jk.meta, jk.tasks, jk.errors, jk.dlq, jk.unannounced),
                         (index, serial, created_ms or ""))
        raise_for_code("replay", reply, jk.job_id)

    def replay_mark(self, qk: QueueKeys, letter: str, entry_id: str, token: str,
                    life_ms: int, target: str = "") -> tuple[int, str]:
        """Claim (``target`` "") or complete the one replay of dead letter ``letter``;
        return (2 claimed now | 1 this token's | 0 another caller's, target job)."""
        r = self.run("replay_mark", (qk.replayed(letter), qk.replayed_entry(entry_id)),
                     (token, life_ms, target))
        return int(r[0]), _s(r[1])

    def unannounced(self, jk: JobKeys, limit: int) -> tuple[JobMeta, list[tuple[str, bytes,
                                                                                bytes]]]:
        """A job's dead letters not yet announced: (the job, [(field, error record JSON,
        type letter + payload)])."""
        r = self.run("unannounced", (jk.unannounced, jk.errors, jk.dlq, jk.meta), (limit,))
        return JobMeta(_s(r[0]), int(r[1]), int(r[2])), [(_s(r[i]), r[i + 1], r[i + 2])
                                                          for i in range(3, len(r), 3)]

    @staticmethod
    def announce_call(qk: QueueKeys, letter: str, life_ms: int, maxlen: int,
                      fields: Sequence[Any]) -> Call:
        """Copy one dead letter to the dead stream once (``fields``: job, field, error,
        attempts, at ms, type letter, payload, serial, job created ms); replies
        {added 1|0, entry id}."""
        return Call("announce", (qk.dead, qk.announced(letter)), (maxlen, life_ms, *fields))

    def announced(self, jk: JobKeys, letters: Sequence[tuple[str, int]]) -> int:
        """Drop announced dead letters (field, serial) from ``unannounced``; return how
        many still wait."""
        args: list[Any] = list(itertools.chain.from_iterable(letters))
        return int(self.run("announced", (jk.unannounced, jk.errors), args))

    def clear_owed(self, qk: QueueKeys, job_id: str, score: float | None = None) -> bool:
        """Remove a job from ``owed`` (only with this score, when given)."""
        return bool(self.run("clear_owed", (qk.owed,),
                             (job_id, "" if score is None else repr(score))))

    def record_start(self, jk: JobKeys, entry_id: str, consumer: str) -> bool:
        """Record the start of a suspect entry; False when it is settled already."""
        return bool(self.run("record_start", (jk.tasks, jk.inflight, jk.meta),
                             (entry_id, consumer)))

    def reap_leases(self, qk: QueueKeys, limit: int = 1000) -> tuple[int, list[str]]:
        """Return expired leases and dead workers' leases; return (count, dead worker ids)."""
        r = self.run("reap_leases", (qk.workers, qk.leased, qk.owners, qk.tokens, qk.ready,
                                     qk.wake), (WAKE_CAP, limit))
        return int(r[0]), [_s(w) for w in r[1:]]

    def forget_job(self, qk: QueueKeys, job_id: str) -> int:
        """Remove an orphan (registered job whose keys are gone) and its tokens."""
        return int(self.run("forget_job", (qk.active, qk.tokens, qk.ready, qk.leased, qk.parked,
                                           qk.owners, qk.kick), (job_id, MAX_CONCURRENCY)))

    def delete_consumers(self, jk: JobKeys, names: Sequence[str], min_idle_ms: int) -> int:
        """Delete those of ``names`` that have nothing pending and were idle at least
        ``min_idle_ms``, each checked in the same call; return how many were deleted."""
        if not names:
            return 0
        return int(self.run("delete_consumers", (jk.tasks,), [GROUP, min_idle_ms, *names]))

    def trim(self, qk: QueueKeys, retention_ms: int, limit: int = 1000) -> tuple[int, int, int, bool]:
        """Forget expired dedup keys and `finished` entries (by their own times) and events
        older than ``retention_ms``; return (dedup keys, finished, events, more is due)."""
        r = self.run("trim", (qk.events, qk.finished, qk.dedup, qk.dedup_expiry),
                     (retention_ms, limit))
        return int(r[0]), int(r[1]), int(r[2]), r[3] == 1

    def expire_orphan(self, jk: JobKeys, retention_ms: int) -> int:
        """Give the keys of a job without meta a lifetime; return how many had none."""
        return int(self.run("expire_orphan", (jk.meta, jk.tasks, jk.results, jk.errors, jk.retry,
                                              jk.inflight, jk.dlq, jk.unannounced, jk.added,
                                              jk.ids), (retention_ms,)))

    def unlock(self, key: str, holder: str) -> bool:
        """Delete lock ``key`` if ``holder`` still owns it."""
        return bool(self.run("unlock", (key,), (holder,)))

    # -- keyed (fenced, idempotent) adds and abort: the Spark writer ----------------

    @staticmethod
    def add_keyed_call(jk: JobKeys, keep_ms: int,
                       entries: Sequence[tuple[str, bytes, bytes]]) -> Call:
        """Add sub-requests under deterministic ids, skipping ids added before.

        ``entries`` are ``(id, type letter, payload)``, at most ``ADD_CHUNK``;
        ``keep_ms`` is the lifetime of the id maps; see add_keyed-4.lua.
        """
        args: list[Any] = [keep_ms]
        for sub_id, kind, data in entries:
            args += [sub_id, kind, data]
        return Call("add_keyed", (jk.meta, jk.tasks, jk.added, jk.ids), args)

    @staticmethod
    def parse_add_keyed(reply: Any, job_id: str) -> tuple[int, int, int]:
        """(added, skipped, new total); raises JobNotFound / JobClosed on error codes."""
        raise_for_code("add_keyed", reply, job_id)
        return int(reply[0]), int(reply[1]), int(reply[2])

    def add_keyed(self, jk: JobKeys, keep_ms: int,
                  entries: Sequence[tuple[str, bytes, bytes]]) -> tuple[int, int, int]:
        """Run :meth:`add_keyed_call` now; return (added, skipped, new total)."""
        call = self.add_keyed_call(jk, keep_ms, entries)
        return self.parse_add_keyed(self.run(call.name, call.keys, call.args), jk.job_id)

    def abort_job(self, jk: JobKeys, reason: str, token: str | None = None) -> JobReply:
        """Make an open or active job ``aborted`` (terminal); ``completed`` says this call did it
        (also when it is sent again after a lost reply: idempotent by ``token``, drawn
        when not given)."""
        reply = self.run("abort_job", (jk.meta, jk.tasks, jk.results, jk.errors, jk.retry,
                                       jk.inflight, jk.added, jk.ids, jk.dlq, jk.unannounced),
                         (reason, token or new_token()))
        raise_for_code("abort_job", reply, jk.job_id)
        return JobReply.parse(reply)

    def expire_keyed(self, jk: JobKeys) -> int:
        """Give a terminal job's id maps the job's remaining lifetime; return it (ms) or 0."""
        reply = self.run("expire_keyed", (jk.meta, jk.added, jk.ids), ())
        raise_for_code("expire_keyed", reply, jk.job_id)
        return int(reply)
