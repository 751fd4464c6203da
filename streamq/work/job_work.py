"""A slot's work on the jobs of the tokens it claimed (the job lane): read each job's
next batch (or take the batch read ahead), run it, and acknowledge the results now or
with the next settle. :mod:`streamq.lane_work` is the small-job lane's counterpart.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import redis

from streamq.base import config, hooks
from streamq.base.entry_fields import Batch, batch_ids, is_suspect, streams_read
from streamq.base.keys import JobKeys, QueueKeys
from streamq.base.members import token_job
from streamq.base.replies import JobReply
from streamq.storage.connection import is_transient, pipelined
from streamq.work.lane_work import LaneWorker
from streamq.work.leases import SlotHold
from streamq.work.round_trip import Finish
from streamq.work.sources import JobSource

log = logging.getLogger("streamq.worker")

_UNREAD = object()  # a claimed token's job not read ahead (a read's reply may be None)
#: results of a round not yet acknowledged: their token's position, the job, the results
_Pending = list[tuple[int, JobKeys, list[tuple[str, int, bytes]]]]


def _entries(reply: Any) -> list[tuple[bytes, list[bytes]]]:
    """The entries of a raw XREADGROUP reply of one stream, each an id and its flat
    field list ``[field, value, ...]`` (see :func:`streamq.entry_fields.streams_read`)."""
    return [entry for _, entries in streams_read(reply) for entry in entries]


class SlotState(Protocol):
    """What job work reads of its slot: the shard it claims from, how many entries a
    read asks for, and what it holds."""

    @property
    def qk(self) -> QueueKeys: ...
    @property
    def read_n(self) -> int: ...
    @property
    def hold(self) -> SlotHold: ...


class JobWork:
    """The job-lane work of one slot."""

    def __init__(self, worker: LaneWorker, slot: SlotState) -> None:
        self.w = worker
        self.slot = slot
        self.run_entries = worker.entries

    def read(self, jk: JobKeys, count: int = 0) -> tuple[Any, ...]:
        """The XREADGROUP of a job's next batch (new entries only, no blocking)."""
        self.w.leases.reading(jk.job_id)  # watched for a cancel (LeaseKeeper.see_cancels)
        return ("XREADGROUP", "GROUP", config.GROUP, self.w.id, "COUNT",
                count or self.slot.read_n, "STREAMS", jk.tasks, ">")

    def work(self, tokens: list[str], finishes: list[Finish],
             preread: dict[str, Any]
             ) -> tuple[list[tuple[str, str]], list[str], list[Batch]]:
        """Serve the claimed tokens once (a job in ``preread`` was read already).

        Returns how to settle each token, the jobs to follow (read with the next
        settle: a full batch was read, so more is likely waiting), and the results
        left to acknowledge with the next settle: when every job with results left is
        followed, they go in that round trip, first; otherwise they are acknowledged
        here, and the jobs this completed are added to ``finishes``."""
        jks = [self.slot.qk.job(token_job(t)) for t in tokens]
        replies, refused = self._read_tokens(tokens, jks, preread)
        reads = self._tracked(jks, replies)
        hooks.at("after_read")
        settled, follow, pending = self._run_tokens(tokens, jks, reads, refused)
        return self._ack_or_follow(settled, follow, pending, finishes)

    def _read_tokens(self, tokens: list[str], jks: list[JobKeys], preread: dict[str, Any]
                     ) -> tuple[list[Any], set[int]]:
        """Each claimed token's job's read (raw: read ahead already, or now, in one round
        trip with the timeouts not known yet), and the positions of tokens refused a
        rate-limit permit (parked, their read None)."""
        w = self.w
        replies = [preread.pop(jk.job_id, _UNREAD) for jk in jks]
        # raw replies, turned into entries by _entries(); an error (NOGROUP: the job
        # finished meanwhile) is returned in place of its reply
        unread = [i for i, r in enumerate(replies) if r is _UNREAD]
        # under rate limits a read asks for the permits it was granted; a token refused
        # one is parked until its job's next permit is due (rates.Limiter.grant)
        granted = ({unread[k]: n for k, n in w.rates.grant(
                        self.slot.qk, [tokens[i] for i in unread], self.slot.read_n).items()}
                   if unread and w.rates.active() else {})
        refused = {i for i, n in granted.items() if n == 0}
        unread = [i for i in unread if i not in refused]
        # the jobs' timeouts not known yet are read in the same round trip (watchdog)
        asks = w.timeouts.unknown([jks[i].job_id for i in unread]) if unread else []
        got = pipelined(w.redis, [*(self.read(jks[i], granted.get(i, 0)) for i in unread),
                                  *(w.timeouts.command(j) for j in asks)])
        for job, raw in zip(asks, got[len(unread):]):
            w.timeouts.learn(job, raw)
        for i, reply in zip(unread, got):
            replies[i] = reply
        for i in refused:
            replies[i] = None
        if granted:
            self.give_back(jks, replies, granted)
        for r in replies:
            if isinstance(r, redis.ResponseError) and is_transient(r):
                raise r  # OOM, BUSY, ...: waited out by the loop, tokens released
        return replies, refused

    def _tracked(self, jks: list[JobKeys], replies: list[Any]) -> list[Any]:
        """The reads' entries, each job's with its entry ids and the set heartbeats keep
        fresh until settled (an error stays in place of its read)."""
        w = self.w
        reads: list[Any] = [r if isinstance(r, Exception) else _entries(r) for r in replies]
        got = [(i, jk.job_id, [e[0].decode() for e in read])
               for i, (jk, read) in enumerate(zip(jks, reads))
               if read and not isinstance(read, Exception)]
        # everything read is kept fresh until settled
        held = w.leases.track(self.slot.hold, [(job, ids) for _, job, ids in got])
        for (i, _, ids), unacked in zip(got, held):
            reads[i] = (reads[i], ids, unacked)
        return reads

    def _run_tokens(self, tokens: list[str], jks: list[JobKeys], reads: list[Any],
                    refused: set[int]) -> tuple[list[tuple[str, str]], list[str], _Pending]:
        """Run the entries read of each token's job: how to settle each token, the jobs
        to follow, and the results not yet acknowledged (with their token's position)."""
        w, runner = self.w, self.run_entries
        settled: list[tuple[str, str]] = []
        follow: list[str] = []
        pending: _Pending = []
        waits: list[float] = []  # metrics, added in one go before anything is acknowledged
        durations: list[float] = []
        ran: dict[int, tuple[list[tuple[str, int, bytes]], bool]] = {}
        live = [i for i, read in enumerate(reads) if isinstance(read, tuple)]
        sources = {i: self.source(jks[i], reads[i][2]) for i in live}
        if w.loop is not None and len(live) > 1 and not any(
                is_suspect(flat) for i in live for _, flat in reads[i][0]):
            # an async handler: every token's entries at once (a suspect entry runs
            # alone, below, so a kill inside it counts an attempt for it alone)
            outs = w.async_entries.run([(sources[i], *reads[i][:2]) for i in live], waits,
                                       durations, len(live))
            ran = dict(zip(live, outs))
        for pos, (tok, jk, read) in enumerate(zip(tokens, jks, reads)):
            if pos in refused:
                settled.append((tok, "p"))
                continue
            if (isinstance(read, redis.ResponseError) and not is_transient(read)) or not read:
                # no stream/group (job finished or gone) or nothing new: park, or drop when done
                settled.append((tok, self.idle_mode(jk.job_id)))
                continue
            if isinstance(read, Exception):
                raise read
            entries, ids, _ = read
            done, completed = ran[pos] if pos in ran else runner.run_entries(
                sources[pos], entries, ids, waits, durations)
            settled.append((tok, "d" if completed else "r"))
            if (not completed and len(entries) >= self.slot.read_n and jk.job_id not in follow
                    and not runner.slow_now()):
                follow.append(jk.job_id)  # once per job, however many of its tokens it holds
            if done:
                pending.append((len(settled) - 1, jk, done))
        w.outcomes.observe(waits, durations)
        return settled, follow, pending

    def source(self, jk: JobKeys, unacked: set[str]) -> JobSource:
        """The source of a batch of ``jk`` read with a token (``unacked``: its entries
        kept fresh until settled), with the job's timeout (known from the read's round
        trip: the watchdog)."""
        w = self.w
        return JobSource(w, jk, unacked, self.slot.qk, w.timeouts.of(jk.job_id, w.redis))

    def _ack_or_follow(self, settled: list[tuple[str, str]], follow: list[str],
                       pending: _Pending, finishes: list[Finish]
                       ) -> tuple[list[tuple[str, str]], list[str], list[Batch]]:
        """Leave the results to the next settle when every job with results is followed;
        otherwise acknowledge them now (the jobs this completed join ``finishes``)."""
        w = self.w
        batches = [(jk, d) for _, jk, d in pending]
        if batches and not w.stopping.is_set() and all(
                jk.job_id in follow for jk, _ in batches):
            # followed jobs rarely complete on this ack: their tokens are released (r)
            # in the same round trip; one that did complete is finished with the settle
            # after, and the read-ahead of it finds its stream gone
            w.leases.awaiting(self.slot.hold, batch_ids(batches))  # fresh until acknowledged
            return settled, follow, batches
        # acknowledge what is left of every job in one round trip
        completed_now: list[tuple[str, JobReply]] = []
        oks = w.outcomes.ack_many(batches, completed_now, shard=self.slot.qk)
        finishes.extend((job, r, self.slot.qk) for job, r in completed_now)
        for (pos, _, _), ok in zip(pending, oks):
            if ok:
                settled[pos] = (settled[pos][0], "d")
                follow = [j for j in follow if j != token_job(settled[pos][0])]
        return settled, follow, []

    def give_back(self, jks: list[JobKeys], replies: list[Any], granted: dict[int, int]
                  ) -> None:
        """Return the permits (``granted``: taken, by token position) of entries a read
        did not find."""
        unused = {i: n - (0 if isinstance(replies[i], Exception) else len(_entries(replies[i])))
                  for i, n in granted.items() if n > 0}
        unused = {i: n for i, n in unused.items() if n > 0}
        if unused:
            w = self.w
            clients = w.rates.clients_of([jks[i].job_id for i in unused])
            w.rates.give_back([(c, n) for c, n in zip(clients, unused.values())])

    def kept_reads(self, follow: list[str], reads: list[Any], claimed: list[str]
                   ) -> dict[str, Any]:
        """The read ahead of each followed job of which a token was claimed; the entries
        read of the others (a more urgent job took the slot) are handed back at once."""
        preread = dict(zip(follow, reads))
        if preread:
            held = {token_job(t) for t in claimed}
            for job in [j for j in preread if j not in held]:
                read = preread.pop(job)
                entries = [] if isinstance(read, Exception) else _entries(read)
                if entries:
                    self.w.outcomes.requeue(job, [e[0] for e in entries], self.slot.qk)
        return preread

    def promote(self, jobs: list[str]) -> None:
        """Promote the due retries of ``jobs`` (jobs' hash slots), then, in the queue's hash slot,
        unpark the jobs that got work and note when each next retry is due."""
        w, qk = self.w, self.slot.qk
        replies = w.scripts.run_many([w.scripts.promote_retries_call(qk.job(j)) for j in jobs])
        calls = []
        for job, raw in zip(jobs, replies):
            r = w.scripts.parse_promote(raw)
            if r.moved and r.concurrency:
                calls.append(w.scripts.unpark_call(qk, job, r.concurrency))
            if r.wait_ms >= 0:
                calls.append(w.scripts.schedule_retry_call(qk, job, r.wait_ms))
        w.scripts.run_many(calls)

    def idle_mode(self, job: str) -> str:
        """How to settle a token whose read found nothing new: park it, release it (a
        retry was due and is back in the stream) or drop it (the job is done or gone)."""
        w = self.w
        jk = self.slot.qk.job(job)
        state: bytes | None = w.redis.hget(jk.meta, "state")  # type: ignore[assignment]
        if state is None:
            return "d"  # the job is gone (expired, or never created): nothing to serve
        if state in (b"open", b"active"):
            r = w.scripts.promote_retries_full(jk)
            if r.wait_ms >= 0:  # a later retry: live workers promote it when due
                call = w.scripts.schedule_retry_call(self.slot.qk, job, r.wait_ms)
                w.scripts.run(call.name, call.keys, call.args)
            return "r" if r.moved else "p"
        # terminal in its own hash slot: make sure the queue's hash slot knows (idempotent)
        self.finish_from_meta(job)
        return "d"

    def finish_from_meta(self, job: str) -> None:
        w = self.w
        m = w.redis.hmget(self.slot.qk.job(job).meta, "state", "total", "done", "failed",
                          "concurrency", "dedup", "priority", "client", "created", "retention",
                          "incarnation", "dead")
        if m[0] is None:
            return
        reply = JobReply.parse([1, *m])
        call = w.q.finish_call(job, reply, self.slot.qk)
        w.scripts.run(call.name, call.keys, call.args)
