"""One slot of a worker: the loop that settles, claims, reads and serves tokens.

A slot claims a token (permission to run one sub-request of one job at a
time), reads up to ``batch`` entries of that job with XREADGROUP, runs them
(:mod:`streamq.entries`), acknowledges them, finishes jobs that completed,
and settles the token: back to ready, parked (nothing deliverable) or dropped
(job finished) while claiming the next one in the same round trip. A slot
that claims also takes the jobs whose retries are due and promotes them. With
nothing ready a slot blocks on the queue's wake list, at most until the next
retry is due.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis

from . import config
from .connection import is_access_error, is_transient, pipelined
from .entries import Batch, batch_ids, is_suspect
from .keys import JobKeys, QueueKeys, token_job
from .lane_work import LANE_DUE, LaneEntry, LaneWork, streams_read
from .rates import RATE_DUE, parse_due
from .scripts import JobReply

if TYPE_CHECKING:
    from .worker import Worker

log = logging.getLogger("streamq.worker")

_UNREAD = object()  # a claimed token's job not read ahead (a read's reply may be None)
#: a job an acknowledgement completed, its reply and the shard it lives on
Finish = tuple[str, JobReply, QueueKeys]
#: first and longest pause after a transient Redis error in a slot, seconds
_PAUSE_FIRST_S, _PAUSE_MAX_S = 0.25, 2.0


def _entries(reply: Any) -> list[tuple[bytes, list[bytes]]]:
    """The entries of a raw XREADGROUP reply of one stream, each an id and its flat
    field list ``[field, value, ...]`` (see :func:`streamq.lane_work.streams_read`)."""
    return [entry for _, entries in streams_read(reply) for entry in entries]


class Slot:
    """One handler slot of a worker (run in its own thread)."""

    def __init__(self, worker: Worker, index: int) -> None:
        self.w = worker
        self.index = index
        self.hold = worker.leases.holds[index]
        self.run_entries = worker.entries
        #: numbers this slot's settle calls: a settle sent again after a lost reply
        #: (same number) returns the first reply and changes nothing
        self._call_base = uuid.uuid4().hex[:8]
        self._calls = 0
        shards = worker.shards
        #: the queue shard whose tokens the slot holds, and where it claims next
        self.qk = shards[index % len(shards)]
        #: the shard the next settle claims from (chosen by the last settle's peek)
        self.next_qk = self.qk
        #: the last peek found ready tokens on some shard
        self._ready_seen = False
        #: ms until the next retry is due, as the last settle said (-1: none waits)
        self._retry_wait_ms = -1
        #: tokens the next settle claims: the worker's prefetch, or, when that is 0,
        #: adapted to the work by :meth:`adapt`
        if worker.is_async:  # its tokens run at once: never more than its share
            self.claim_n = min(worker.prefetch or worker.slot_share, worker.slot_share)
        else:
            self.claim_n = worker.prefetch or 1
        #: entries each read asks for: the worker's batch, or, when that is 0, adapted
        #: to the work by :meth:`adapt_batch`; an async slot runs what it read at once,
        #: so a slow entry holds none of the others: it reads its share from the start
        self.read_n = worker.batch or (worker.slot_share if worker.is_async
                                       else config.AUTO_BATCH_START)
        #: the small-job lane's reads, runs and acknowledgements (:mod:`streamq.lane_work`)
        self.lane = LaneWork(self)
        #: the last lane read filled a batch, or found a lane it did not cover
        self._lane_more = False
        #: the last settle acknowledged small jobs (the after_ack fault point)
        self._lane_acked = False
        #: the priority of the job whose tokens the last settle claimed
        self._claimed_prio = 0
        #: the last settle found the queue paused: claim nothing, read nothing ahead,
        #: wait on the wake list until it is resumed
        self.paused = False

    def run(self) -> None:
        w = self.w
        settled: list[tuple[str, str]] = []
        #: jobs the last acknowledgements completed, finished with the next settle
        finishes: list[Finish] = []
        #: jobs whose last read was a full batch: their next batch is read in the round
        #: trip of the next settle, and served at once if that settle gives a token back
        follow: list[str] = []
        #: results of followed jobs, acknowledged first in the round trip of the next settle
        acks: list[Batch] = []
        stop_seen: float | None = None
        pause = _PAUSE_FIRST_S
        gov = w.governor
        while True:
            stopping = w.stopping.is_set()
            if stopping and not settled and not finishes and not acks and not self.lane.acks:
                return  # nothing to hand back
            if stopping and stop_seen is None:
                stop_seen = time.monotonic()
            # a slot the governor does not let serve settles what it holds, then waits
            serving = stopping or gov is None or gov.serves(self.index)
            if gov is not None and not serving and not (
                    settled or finishes or acks or self.lane.acks):
                gov.wait(self.index, w.stopping)
                gov.tick()  # the serving slots may all be inside slow handlers
                continue
            spec, follow = ([] if stopping or self.paused or not serving else follow), []
            if w.entries.recently_slow():
                # slow handlers lately: one at a time, so no slot holds entries that
                # another slot or worker could start now
                self.read_n = self.read_n if w.batch or w.is_async else 1
                self.claim_n = self.claim_n if w.prefetch or w.is_async else 1
            try:
                if spec and w.rates.active():
                    spec = []  # no read ahead under rate limits: a read takes permits first
                claimed, due, preread, lanes = self.settle(
                    settled, finishes, 0 if stopping or not serving else self.claim_n, spec,
                    acks)
                settled = []
                if acks or self._lane_acked:
                    acks = []
                    w.fault("after_ack")
                pause = _PAUSE_FIRST_S
                # until the work is done, a failure releases the tokens on the next settle
                settled = [(t, "r") for t in claimed]
                if stopping or not serving:
                    # a resent settle may report tokens claimed before the stop: they are
                    # released, and jobs the last acks completed finished, by one more call
                    continue
                if self.paused:
                    self.idle()  # (a resume wakes it)
                    continue
                if due:
                    self.promote(due)
                if not claimed and not lanes:
                    if gov is not None:
                        gov.emptied()
                    if not due and not self._ready_seen and not self._lane_more:
                        self.idle()
                    continue
                if claimed:
                    w.fault("after_claim")
                started = time.perf_counter()
                try:
                    # lane entries as urgent as the claimed tokens' job, or more, run first
                    prio = self._claimed_prio if claimed else config.MAX_PRIORITY + 1
                    cut = next((n for n, e in enumerate(lanes) if e.priority > prio), len(lanes))
                    if cut:
                        self.lane.run(self.qk, lanes[:cut])
                    if claimed:
                        settled, follow, acks = self.work(claimed, finishes, preread)
                    if cut < len(lanes):
                        self.lane.run(self.qk, lanes[cut:])
                finally:
                    w.leases.untrack(self.hold)
                took = time.perf_counter() - started
                if not w.batch:
                    self.read_n = self.adapt_batch(took, bool(follow) or self._lane_more)
                if not w.prefetch and not w.is_async:
                    self.claim_n = self.adapt(len(claimed), bool(follow), took)
                w.entries.slowed()  # the round's hand-back, if any, is acted on
                with w.stats.lock:  # once per round
                    w.stats.claims += 1
                    w.stats.tokens += len(claimed)
                    w.stats.reads[self.index] = self.read_n
                if claimed and not acks:
                    # the claimed jobs' results were acknowledged in the round (a round
                    # of lane entries only acknowledges with the next settle, which
                    # fires the point then)
                    w.fault("after_ack")
                if gov is not None:
                    gov.tick()
            except Exception as e:
                if is_access_error(e):
                    w.fatal_error(e)
                    continue
                if not is_transient(e):
                    log.exception("unexpected error in a worker slot; its tokens are released")
                    w.pause(stopping, 1.0)
                    continue
                if stop_seen is not None and time.monotonic() - stop_seen >= w.stop_retry_s:
                    log.error("redis unavailable while stopping (%s): leaving %d token(s) to "
                              "expire; the reaper hands their entries to other workers", e,
                              len(settled))
                    with w.leases.lock:
                        w.undrained += len(settled)
                    return
                w.unreachable(e)
                log.warning("redis unavailable (%s: %s); retrying in %.2f s", type(e).__name__, e,
                            pause)
                w.pause(stopping, pause)
                pause = min(_PAUSE_MAX_S, pause * 2)

    def adapt(self, claimed: int, followed: bool, took: float) -> int:
        """The next claim's size, for a worker started with prefetch 0: small jobs (no
        read filled a batch) are best served many per round trip, so a claim that got
        all it asked for in a short round (``took`` under AUTO_BATCH_ROUND_S) doubles,
        up to MAX_AUTO_PREFETCH; a round that took twice that halves it, down to one,
        so slow handlers hold few leases and a more urgent job is claimed soon; a job
        that filled a batch is big, best served one token at a time with its next
        batch read ahead, so the claim drops to one. Otherwise it keeps its size."""
        if followed:
            return 1
        if took > 2 * config.AUTO_BATCH_ROUND_S:
            return max(1, self.claim_n // 2)
        if claimed >= self.claim_n and took < config.AUTO_BATCH_ROUND_S:
            return min(config.MAX_AUTO_PREFETCH, self.claim_n * 2)
        return self.claim_n

    def adapt_batch(self, took: float, followed: bool) -> int:
        """The next read's size, for a worker started with batch 0: while reads come
        back full (a big job) and a round takes less than AUTO_BATCH_ROUND_S, the
        batch doubles, up to MAX_AUTO_BATCH (fewer, larger round trips); a round that
        took twice that halves it, down to one, so a more urgent job waits about that
        long, or one slow entry, for the round in progress. Otherwise it keeps its size."""
        least = self.w.slot_share if self.w.is_async else 1
        if took > 2 * config.AUTO_BATCH_ROUND_S:
            return max(least, self.read_n // 2)
        if followed and took < config.AUTO_BATCH_ROUND_S:
            return min(config.MAX_AUTO_BATCH, self.read_n * 2)
        return self.read_n

    def idle(self) -> None:
        """Nothing claimed: block on the wake list, at most until the next retry is due
        (with several shards, until a waker hears of work on any of them)."""
        w = self.w
        timeout = w.idle_wait_s
        if self._retry_wait_ms >= 0:
            timeout = min(timeout, max(0.01, self._retry_wait_ms / 1000))
        throttled = w.rates.next_wake_s()  # a rate-limited client's small jobs
        if throttled is not None:
            timeout = min(timeout, max(0.01, throttled))
        if len(w.shards) == 1:
            w.redis.blpop([w.keys.wake], timeout=timeout)
            return
        woken = w.wakers.wait(timeout)
        if woken is not None:
            self.next_qk = woken

    def settle(self, settled: list[tuple[str, str]], finishes: list[Finish],
               claim: int, follow: Sequence[str] = (), acks: Sequence[Batch] = ()
               ) -> tuple[list[str], list[str], dict[str, Any], list[LaneEntry]]:
        """Acknowledge ``acks``, finish the completed jobs in ``finishes``, settle the
        held tokens and claim up to ``claim`` new ones, then read the next batch of each
        job in ``follow``: one round trip. ``finishes`` is left holding the jobs those
        acknowledgements completed (finished with the next settle).

        Returns the claimed tokens, the jobs whose retries are due and, for each
        followed job of which a token was claimed, its raw read, and the entries a read
        of the shard's small-job lanes got (when claiming). Entries read for a job
        of which no token was claimed (a more urgent job took the slot) are handed back
        at once, as a drain does. The lane's waiting acknowledgements go first.
        """
        w = self.w
        old, new = self.qk, (self.next_qk if claim > 0 else self.qk)
        lane_acks = list(self.lane.acks)
        calls = [*lane_acks, *(w.scripts.ack_call(jk, done) for jk, done in acks)]
        sent = len(finishes)
        released = [t for t, _ in settled]
        if finishes:
            # finishing a job removes its tokens (now, or when it was finished before):
            # a token of a job finished here needs no drop of its own
            done = {job for job, _, _ in finishes}
            settled = [(t, m) for t, m in settled if m != "d" or token_job(t) not in done]
            by_shard: dict[QueueKeys, list[tuple[str, JobReply]]] = {}
            for job, reply_, qk in finishes:
                by_shard.setdefault(qk, []).append((job, reply_))
            calls += [w.q.finish_many_call(jobs, qk) for qk, jobs in by_shard.items()]
        # the call keeps its number until a reply came back: a call sent again after a
        # failure returns what the first one did, if it ran
        seq = f"{self._call_base}:{self._calls}"
        if new is not old and settled:
            # the held tokens go back to their own shard; the claim is made in another
            calls.append(w.scripts.settle_call(old, w.id, self.index, seq, w.lease_ms, 0,
                                               settled, keep_ms=w.info_ttl_ms))
            settled = []
        calls.append(w.scripts.settle_call(new, w.id, self.index, seq, w.lease_ms, claim,
                                           settled, keep_ms=w.info_ttl_ms))
        if new is not old:
            follow = []  # a followed job's token is not claimed back from another shard
        follow = list(dict.fromkeys(follow))  # one read per job: a second would be lost
        peeks = [("ZRANGE", qk.ready, 0, 0, "WITHSCORES")
                 for qk in w.shards] if claim > 0 and len(w.shards) > 1 else []
        lane_reads = self.lane.commands(new, self.read_n) if claim > 0 and not self.paused else []
        replies, reads = w.scripts.run_then(calls, [*(self.read(JobKeys(j)) for j in follow),
                                                    *peeks, *lane_reads])
        self._calls += 1
        self._lane_acked = bool(lane_acks)
        if lane_acks:
            self.lane.acked(replies[: len(lane_acks)])
            del self.lane.acks[: len(lane_acks)]
            replies = replies[len(lane_acks):]
        reply = w.scripts.parse_settle(replies[-1])
        self.paused = reply.paused
        lanes: list[LaneEntry] = []
        self._lane_more = False
        if lane_reads:
            lane_replies = reads[len(reads) - len(lane_reads):]
            reads = reads[: len(reads) - len(lane_reads)]
            if reply.paused:  # read in the round trip that found the pause: handed back
                self.lane.hand_back(new, lane_replies, self.read_n)
            else:
                lanes, self._lane_more = self.lane.take(new, lane_replies, self.read_n)
                if w.rates.active():  # rate-limited clients' lanes: permits, then reads
                    limited, more = self.lane.take_limited(new, self.read_n)
                    if limited:
                        lanes = sorted(lanes + limited, key=lambda e: e.priority)
                    self._lane_more = self._lane_more or more
        del finishes[:sent]
        acked: list[tuple[str, JobReply]] = []
        self.run_entries.acked(acks, replies[: len(acks)], acked)
        w.leases.landed(self.hold, batch_ids(acks))
        finishes.extend((job, r, old) for job, r in acked)
        claimed = [t for t, _ in reply.claimed]
        if reply.claimed:
            self._claimed_prio = int(min(float(sc) for _, sc in reply.claimed) // 1e12)
        self.qk = new
        w.leases.settled(self.hold, released, claimed, new)
        if claim > 0:
            self._retry_wait_ms = reply.wait_ms
        if peeks:
            self.next_qk, self._ready_seen = self.choose(reads[len(follow):], bool(claimed))
            reads = reads[: len(follow)]
        preread = dict(zip(follow, reads))
        if preread:
            held = {token_job(t) for t in claimed}
            for job in [j for j in preread if j not in held]:
                read = preread.pop(job)
                entries = [] if isinstance(read, Exception) else _entries(read)
                if entries:
                    self.run_entries.requeue(job, [e[0] for e in entries])
        return claimed, reply.due, preread, lanes

    def choose(self, heads: list[Any], claimed: bool) -> tuple[QueueKeys, bool]:
        """The shard to claim from next, from the head of every shard's ready set read
        in the last settle: the most urgent head's (lowest priority), the next in turn
        after this slot's shard among equally urgent ones; and whether any shard had a
        ready token. With none ready, the next shard in turn."""
        shards = self.w.shards
        n, at = len(shards), shards.index(self.qk)
        best: tuple[int, int] | None = None
        pick = shards[(at + 1) % n]
        for step in range(1, n + 1):
            k = (at + step) % n
            head = heads[k] if k < len(heads) else None
            if not head or isinstance(head, Exception):
                continue
            prio = int(float(head[1] if isinstance(head[0], (bytes, str)) else head[0][1]) // 1e12)
            if best is None or prio < best[0]:
                best, pick = (prio, k), shards[k]
        return pick, best is not None

    def promote(self, jobs: list[str]) -> None:
        """Promote the due retries of ``jobs`` (job slots), then, in the queue's slot,
        unpark the jobs that got work and note when each next retry is due."""
        w = self.w
        lanes = [j for j in jobs if j.startswith(LANE_DUE)]
        if lanes:
            self.lane.promote(self.qk, lanes)
            jobs = [j for j in jobs if not j.startswith(LANE_DUE)]
        rated = [parse_due(j) for j in jobs if j.startswith(RATE_DUE)]
        if rated:  # rate-limited jobs whose next permit is due: their tokens back to ready
            jobs = [j for j in jobs if not j.startswith(RATE_DUE)]
            w.scripts.run_many([w.scripts.unpark_call(self.qk, job, n) for job, n in rated])
        replies = w.scripts.run_many([w.scripts.promote_retries_call(JobKeys(j)) for j in jobs])
        calls = []
        for job, raw in zip(jobs, replies):
            r = w.scripts.parse_promote(raw)
            if r.moved and r.concurrency:
                calls.append(w.scripts.unpark_call(self.qk, job, r.concurrency))
            if r.wait_ms >= 0:
                calls.append(w.scripts.schedule_retry_call(self.qk, job, r.wait_ms))
        w.scripts.run_many(calls)

    def read(self, jk: JobKeys, count: int = 0) -> tuple[Any, ...]:
        """The XREADGROUP of a job's next batch (new entries only, no blocking)."""
        self.w.leases.reading(jk.job_id)  # watched for a cancel (LeaseKeeper.see_cancels)
        return ("XREADGROUP", "GROUP", config.GROUP, self.w.id, "COUNT", count or self.read_n,
                "STREAMS", jk.tasks, ">")

    def work(self, tokens: list[str], finishes: list[Finish],
             preread: dict[str, Any]
             ) -> tuple[list[tuple[str, str]], list[str], list[Batch]]:
        """Serve the claimed tokens once (a job in ``preread`` was read already).

        Returns how to settle each token, the jobs to follow (read with the next
        settle: a full batch was read, so more is likely waiting), and the results
        left to acknowledge with the next settle: when every job with results left is
        followed, they go in that round trip, first; otherwise they are acknowledged
        here, and the jobs this completed are added to ``finishes``."""
        w, runner = self.w, self.run_entries
        jks = [JobKeys(token_job(t)) for t in tokens]
        replies = [preread.pop(jk.job_id, _UNREAD) for jk in jks]
        # raw replies, turned into entries by _entries(); an error (NOGROUP: the job
        # finished meanwhile) is returned in place of its reply
        unread = [i for i, r in enumerate(replies) if r is _UNREAD]
        # under rate limits a read asks for the permits it was granted; a token refused
        # one is parked until its job's next permit is due (rates.Limiter.grant)
        granted = ({unread[k]: n for k, n in w.rates.grant(
                        self.qk, [tokens[i] for i in unread], self.read_n).items()}
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
        reads: list[Any] = [r if isinstance(r, Exception) else _entries(r) for r in replies]
        got = [(i, jk.job_id, [e[0].decode() for e in read])
               for i, (jk, read) in enumerate(zip(jks, reads))
               if read and not isinstance(read, Exception)]
        # everything read is kept fresh until settled
        held = w.leases.track(self.hold, [(job, ids) for _, job, ids in got])
        for (i, _, ids), unacked in zip(got, held):
            reads[i] = (reads[i], ids, unacked)
        w.fault("after_read")
        settled: list[tuple[str, str]] = []
        follow: list[str] = []
        pending: list[tuple[int, JobKeys, list[tuple[str, int, bytes]]]] = []
        waits: list[float] = []  # metrics, added in one go before anything is acknowledged
        durations: list[float] = []
        ran: dict[int, tuple[list[tuple[str, int, bytes]], bool]] = {}
        live = [i for i, read in enumerate(reads) if isinstance(read, tuple)]
        if w.loop is not None and len(live) > 1 and not any(
                is_suspect(flat) for i in live for _, flat in reads[i][0]):
            # an async handler: every token's entries at once (a suspect entry runs
            # alone, below, so a kill inside it counts an attempt for it alone)
            outs = runner.run_async([(jks[i], *reads[i]) for i in live], waits, durations,
                                    self.qk)
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
            entries, ids, unacked = read
            done, completed = ran[pos] if pos in ran else runner.run_entries(
                jk, entries, ids, unacked, waits, durations, self.qk)
            settled.append((tok, "d" if completed else "r"))
            if (not completed and len(entries) >= self.read_n and jk.job_id not in follow
                    and not runner.slow_now()):
                follow.append(jk.job_id)  # once per job, however many of its tokens it holds
            if done:
                pending.append((len(settled) - 1, jk, done))
        runner.observe(waits, durations)
        batches = [(jk, d) for _, jk, d in pending]
        if batches and not w.stopping.is_set() and all(
                jk.job_id in follow for jk, _ in batches):
            # followed jobs rarely complete on this ack: their tokens are released (r)
            # in the same round trip; one that did complete is finished with the settle
            # after, and the read-ahead of it finds its stream gone
            w.leases.awaiting(self.hold, batch_ids(batches))  # fresh until acknowledged
            return settled, follow, batches
        # acknowledge what is left of every job in one round trip
        completed_now: list[tuple[str, JobReply]] = []
        oks = runner.ack_many(batches, completed_now, shard=self.qk)
        finishes.extend((job, r, self.qk) for job, r in completed_now)
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

    def idle_mode(self, job: str) -> str:
        """How to settle a token whose read found nothing new: park it, release it (a
        retry was due and is back in the stream) or drop it (the job is done or gone)."""
        w = self.w
        jk = JobKeys(job)
        state: bytes | None = w.redis.hget(jk.meta, "state")  # type: ignore[assignment]
        if state is None:
            return "d"  # the job is gone (expired, or never created): nothing to serve
        if state in (b"open", b"active"):
            r = w.scripts.promote_retries_full(jk)
            if r.wait_ms >= 0:  # a later retry: live workers promote it when due
                call = w.scripts.schedule_retry_call(self.qk, job, r.wait_ms)
                w.scripts.run(call.name, call.keys, call.args)
            return "r" if r.moved else "p"
        # terminal in its own slot: make sure the queue slot knows (idempotent)
        self.finish_from_meta(job)
        return "d"

    def finish_from_meta(self, job: str) -> None:
        w = self.w
        m = w.redis.hmget(JobKeys(job).meta, "state", "total", "done", "failed",
                          "concurrency", "dedup", "priority", "client", "created", "retention",
                          "incarnation", "dead")
        if m[0] is None:
            return
        reply = JobReply.parse([1, *m])
        call = w.q.finish_call(job, reply, self.qk)
        w.scripts.run(call.name, call.keys, call.args)


def slot_threads(worker: Worker) -> list[threading.Thread]:
    """One thread per slot of ``worker`` (not started)."""

    def serve(slot: Slot) -> None:
        try:
            slot.run()
        except BaseException:
            # a slot loop that ends by an error (a defect) would leave its tokens leased
            # by the live heartbeat: the worker stops instead, so they are handed back
            log.exception("worker slot %d stopped by an unexpected error; the worker stops",
                          slot.index)
            if worker.fatal is None:
                worker.fatal = f"worker slot {slot.index} stopped by an unexpected error"
            worker.stopping.set()
        finally:
            worker.watchdog.stop()  # the slot's handler thread, if it made one

    return [threading.Thread(target=serve, args=(Slot(worker, i),), name=f"streamq-slot-{i}",
                             daemon=True)
            for i in range(worker.slots)]
