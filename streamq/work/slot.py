"""One slot of a worker: the loop that settles, claims, reads and serves tokens.

A slot claims a token (permission to run one sub-request of one job at a
time), reads up to ``batch`` entries of that job with XREADGROUP, runs them
(:mod:`streamq.entries`), acknowledges them, finishes jobs that completed,
and settles the token: back to ready, parked (nothing deliverable) or dropped
(job finished) while claiming the next one in the same round trip. A slot
that claims also takes the jobs whose retries are due and promotes them. With
nothing ready a slot blocks on the queue's wake list, at most until the next
retry is due: with one shard, by a ``BLPOP`` at the head of its next round trip
(:mod:`streamq.work.idle_wait`), so the reads behind it run as soon as a signal
comes, in the same round trip.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from streamq.base import config, hooks
from streamq.base.entry_fields import Batch, LaneEntry, batch_ids
from streamq.base.governor import next_claim, next_read
from streamq.base.keys import QueueKeys
from streamq.base.replies import Call, SettleReply
from streamq.model.scripts import JobReply
from streamq.producer.rates import RATE_DUE, parse_due
from streamq.services.shards import most_urgent_shard
from streamq.work.claim_probe import NOTHING, ClaimProbe
from streamq.work.idle_wait import IdleWait
from streamq.work.job_work import JobWork
from streamq.work.lane_work import LANE_DUE, LaneWork, LaneWorker
from streamq.work.round_trip import Carried, Finish, Part, RoundTrip, finishing
from streamq.work.slot_failures import FailingWorker, Failures

if TYPE_CHECKING:
    from streamq.services.wakers import Wakers

log = logging.getLogger("streamq.worker")

class SlotWorker(LaneWorker, FailingWorker, Protocol):
    """What a slot reads of its worker (the settings it serves with, the parts it
    shares with the other slots) and the two counts it writes."""

    fatal: str | None

    @property
    def shards(self) -> list[QueueKeys]: ...
    @property
    def slots(self) -> int: ...
    @property
    def is_async(self) -> bool: ...
    @property
    def batch(self) -> int: ...
    @property
    def prefetch(self) -> int: ...
    @property
    def lease_ms(self) -> int: ...
    @property
    def info_ttl_ms(self) -> int: ...
    @property
    def idle_wait_s(self) -> float: ...
    @property
    def wakers(self) -> Wakers: ...


class Slot:
    """One handler slot of a worker (run in its own thread)."""

    def __init__(self, worker: SlotWorker, index: int) -> None:
        self.w = worker
        self.index = index
        self.hold = worker.leases.holds[index]
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
        #: adapted to the work by :func:`streamq.governor.next_claim`
        if worker.is_async:  # its tokens run at once: never more than its share
            self.claim_n = min(worker.prefetch or worker.slot_share, worker.slot_share)
        else:
            self.claim_n = worker.prefetch or 1
        #: entries each read asks for: the worker's batch, or, when that is 0, adapted
        #: to the work by :func:`streamq.governor.next_read`; an async slot runs what it
        #: read at once, so a slow entry holds none of the others: it reads its share
        #: from the start
        self.read_n = worker.batch or (worker.slot_share if worker.is_async
                                       else config.AUTO_BATCH_START)
        #: the small-job lane's reads, runs and acknowledgements (:mod:`streamq.lane_work`)
        self.lane = LaneWork(worker, self.hold)
        #: the claimed tokens' jobs' reads, runs and acknowledgements (:mod:`streamq.job_work`)
        self.jobs = JobWork(worker, self)
        #: the last lane read filled a batch, or found a lane it did not cover
        self._lane_more = False
        #: whether the next round sends its settle (:mod:`streamq.work.claim_probe`)
        self.probe = ClaimProbe(worker.id, index)
        #: the shard of a claiming settle whose reply did not come back: the next
        #: settle goes there (its number kept, it returns the first reply), before the
        #: slot stops too, so what it may have claimed is learnt and goes back
        self._unanswered: QueueKeys | None = None
        #: the error of a round's second round trip, raised once the round served what
        #: the first one read (:meth:`_settle_reply`)
        self._late: Exception | None = None
        #: the wait of an idle slot on one shard (:mod:`streamq.work.idle_wait`)
        self.waiting = IdleWait()
        #: the last settle acknowledged small jobs (the after_ack fault point)
        self._lane_acked = False
        #: the priority of the job whose tokens the last settle claimed
        self._claimed_prio = 0
        #: the last settle found the queue paused: claim nothing, read nothing ahead,
        #: wait on the wake list until it is resumed
        self.paused = False
        #: what the slot does after a round that failed
        self.failures = Failures(worker, worker.leases.lock)

    def run(self) -> None:
        """Round after round until the worker stops and nothing is left to hand back."""
        w = self.w
        r = Carried()
        stop_seen: float | None = None
        gov = w.governor
        while True:
            stopping = w.stopping.is_set()
            held = r.held(self.lane.acks) or self._unanswered is not None
            if stopping and not held:
                return  # nothing to hand back
            if stopping and stop_seen is None:
                stop_seen = time.monotonic()
            # a slot the governor does not let serve settles what it holds, then waits
            serving = stopping or gov is None or gov.serves(self.index)
            if gov is not None and not serving and not held:
                gov.wait(self.index, w.stopping)
                gov.tick()  # the serving slots may all be inside slow handlers
                continue
            try:
                self._late = None
                self.round(r, stopping, serving)
                if self._late is not None:
                    raise self._late
            except Exception as e:
                # (a lost claim may hold up to claim_n more)
                holding = len(r.settled) + (self.claim_n if self._unanswered else 0)
                if self.failures.failed(e, stopping, stop_seen, holding):
                    return

    def round(self, r: Carried, stopping: bool, serving: bool) -> None:
        """One round trip (:meth:`settle`), then the work it brought: what it did not
        finish is carried in ``r`` to the next round's settle."""
        w = self.w
        spec, r.follow = ([] if stopping or self.paused or not serving else r.follow), []
        if w.entries.recently_slow():
            # slow handlers lately: one at a time, so no slot holds entries that
            # another slot or worker could start now
            self.read_n = self.read_n if w.batch or w.is_async else 1
            self.claim_n = self.claim_n if w.prefetch or w.is_async else 1
        if spec and w.rates.active():
            spec = []  # no read ahead under rate limits: a read takes permits first
        claimed, due, preread, lanes = self.settle(
            r.settled, r.finishes, 0 if stopping or not serving else self.claim_n, spec, r.acks)
        r.settled = []
        if r.acks or self._lane_acked:
            r.acks = []
            hooks.at("after_ack")
        self.failures.ok()
        # until the work is done, a failure releases the tokens on the next settle
        r.settled = [(t, "r") for t in claimed]
        if stopping or not serving:
            # a resent settle may report tokens claimed before the stop: they are
            # released, and jobs the last acks completed finished, by one more call
            return
        if self.waiting.stopped:  # (its lane entries were handed back)
            if due:
                self.promote(due)
            return
        if self.paused:
            self.idle()  # (a resume wakes it)
            return
        if due:
            self.promote(due)
        if not claimed and not lanes:
            if w.governor is not None:
                w.governor.emptied()
            if not (due or self._ready_seen or self._lane_more or self._late or r.finishes):
                self.idle(True)  # (not after a lost settle: it is sent again at once)
            return
        if claimed:
            hooks.at("after_claim")
        self.serve(r, claimed, lanes, preread)

    def serve(self, r: Carried, claimed: list[str], lanes: list[LaneEntry],
              preread: dict[str, Any]) -> None:
        """Run what a settle brought: lane entries as urgent as the claimed job's or
        more, the claimed job's entries, then the other lane entries; adapt the next
        claim and read to how the round went."""
        w = self.w
        started = time.perf_counter()
        try:
            prio = self._claimed_prio if claimed else config.MAX_PRIORITY + 1
            cut = next((n for n, e in enumerate(lanes) if e.priority > prio), len(lanes))
            if cut:
                self.lane.run(self.qk, lanes[:cut])
            if claimed:
                r.settled, r.follow, r.acks = self.jobs.work(claimed, r.finishes, preread)
            if cut < len(lanes):
                self.lane.run(self.qk, lanes[cut:])
        finally:
            w.leases.untrack(self.hold)
        took = time.perf_counter() - started
        if not w.batch:
            self.read_n = next_read(self.read_n, w.slot_share if w.is_async else 1, took,
                                    bool(r.follow) or self._lane_more)
        if not w.prefetch and not w.is_async:
            self.claim_n = next_claim(self.claim_n, len(claimed), bool(r.follow), took)
        w.entries.slowed()  # the round's hand-back, if any, is acted on
        with w.stats.lock:  # once per round
            w.stats.claims += 1
            w.stats.tokens += len(claimed)
            w.stats.reads[self.index] = self.read_n
        if claimed and not r.acks:
            # the claimed jobs' results were acknowledged in the round (a round
            # of lane entries only acknowledges with the next settle, which
            # fires the point then)
            hooks.at("after_ack")
        if w.governor is not None:
            w.governor.tick()

    def idle(self, found_nothing: bool = False) -> None:
        """Nothing claimed: wait on the wake list, at most until the next retry is due.
        With one shard the wait begins the next round trip (:class:`IdleWait`; with
        ``found_nothing``, the round found no lane entry or ready token and was not
        paused: the signals it counted are stale, and dropped after the wait's pop);
        with several, a waker hears of work on any shard (and drops those)."""
        w = self.w
        timeout = w.idle_wait_s
        if self._retry_wait_ms >= 0:
            timeout = min(timeout, max(0.01, self._retry_wait_ms / 1000))
        throttled = w.rates.next_wake_s()  # a rate-limited client's small jobs
        if throttled is not None:
            timeout = min(timeout, max(0.01, throttled))
        if len(w.shards) == 1:
            self.waiting.arm(timeout, found_nothing)
            return
        w.wakers.stale(self.qk, self.waiting.stale(found_nothing))
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
        # (a claiming settle whose reply was lost is sent again to its shard)
        old, new = self.qk, self._unanswered or (self.next_qk if claim > 0 else self.qk)
        trip = RoundTrip(w.scripts)
        holding = (bool(settled or finishes or acks or self.lane.acks)
                   or self._unanswered is not None)
        lane_acks = trip.calls(list(self.lane.acks))
        job_acks = trip.calls([w.scripts.ack_call(jk, done) for jk, done in acks])
        sent, released = len(finishes), [t for t, _ in settled]
        if finishes:
            settled = finishing(settled, finishes, trip, w.q.finish_many_call)
        # a slot holding nothing may read whether a settle could do anything instead
        skip = (claim > 0 and not settled and new is old and self._unanswered is None
                and self.probe.skips(new))
        mine = trip.calls([] if skip else self._settle_calls(old, new, claim, settled))
        # one read per job (a second would be lost); none when the claim is made in
        # another shard (a followed job's token is not claimed back from there)
        follow = list(dict.fromkeys(follow)) if new is old else []
        ahead = trip.commands([self.jobs.read(old.job(j)) for j in follow])
        peeks = trip.commands([("ZRANGE", qk.ready, 0, 0, "WITHSCORES") for qk in w.shards]
                              if claim > 0 and len(w.shards) > 1 else [])
        lane_reads = trip.commands(self.lane.reads.commands(new, self.read_n)
                                   if claim > 0 and not self.paused else [])
        probe = trip.commands(self.probe.commands(new, memo=skip) if claim > 0 else [])
        # an idle slot holding nothing waits first: the reads after it go at the signal
        self.waiting.add(trip, new, claim, holding)
        if mine and claim > 0:
            self._unanswered = new
        trip.send()
        self._calls += 1
        self._lane_acked = bool(lane_acks)
        if lane_acks:
            self.lane.acked(lane_acks.replies)
            del self.lane.acks[: lane_acks.sent]
        del finishes[:sent]
        self._acked(acks, job_acks.replies, finishes, old)
        reply = self._settle_reply(mine, probe, new, claim)
        self.paused = reply.paused
        self.waiting.note(w.stopping.is_set())
        # (read before a settle that failed, which may have noted a pause, or after a
        # wait the stop cut short: handed back)
        back = reply.paused or self._late is not None or self.waiting.stopped
        lanes, self._lane_more = (self.lane.taken(new, lane_reads.replies, self.read_n, back)
                                  if lane_reads else ([], False))
        claimed = [t for t, _ in reply.claimed]
        if reply.claimed:
            self._claimed_prio = int(min(float(sc) for _, sc in reply.claimed) // 1e12)
        self.qk = new
        w.leases.settled(self.hold, released, claimed, new)
        if claim > 0:
            self._retry_wait_ms = reply.wait_ms
        if peeks:
            self.next_qk, self._ready_seen = most_urgent_shard(w.shards, self.qk, peeks.replies)
        return claimed, reply.due, self.jobs.kept_reads(follow, ahead.replies, claimed), lanes

    def _settle_reply(self, mine: Part, probe: Part, qk: QueueKeys, claim: int) -> SettleReply:
        """The round's settle reply: the settle's; when the read went instead
        (:mod:`streamq.work.claim_probe`), nothing, unless it found work for a settle:
        that goes now, in a second round trip (failing, nothing: see :attr:`_late`)."""
        if self.probe.settle_now(qk, mine, probe):
            trip = RoundTrip(self.w.scripts)
            mine = trip.calls(self._settle_calls(qk, qk, claim, []))
            probe = trip.commands(self.probe.commands(qk, memo=False))
            self._unanswered = qk
            try:
                trip.send()
            except Exception as e:  # (the probe knows nothing: the next round settles)
                self._late = e
                return NOTHING
            self._calls += 1
            self.probe.settle_now(qk, mine, probe)
        if mine:
            self._unanswered = None
        return self.w.scripts.parse_settle(mine.replies[-1]) if mine else NOTHING

    def _settle_calls(self, old: QueueKeys, new: QueueKeys, claim: int,
                      settled: list[tuple[str, str]]) -> list[Call]:
        """The settle calls of a round, the one that claims last: the held tokens go
        back to their own shard (``old``) when the claim is made in another (``new``).
        The calls keep their number until a reply came back: a call sent again after a
        failure returns what the first one did, if it ran."""
        w = self.w
        seq = f"{self._call_base}:{self._calls}"
        calls = []
        if new is not old and settled:
            calls.append(w.scripts.settle_call(old, w.id, self.index, seq, w.lease_ms, 0,
                                               settled, keep_ms=w.info_ttl_ms))
            settled = []
        calls.append(w.scripts.settle_call(new, w.id, self.index, seq, w.lease_ms, claim,
                                           settled, keep_ms=w.info_ttl_ms))
        return calls

    def _acked(self, acks: Sequence[Batch], replies: list[Any], finishes: list[Finish],
               shard: QueueKeys) -> None:
        """Count the replies of the round's job acknowledgements; the jobs they
        completed join ``finishes`` (finished with the next settle)."""
        acked: list[tuple[str, JobReply]] = []
        self.w.outcomes.acked(acks, replies, acked)
        self.w.leases.landed(self.hold, batch_ids(acks))
        finishes.extend((job, r, shard) for job, r in acked)

    def promote(self, jobs: list[str]) -> None:
        """Promote the due retries of ``jobs``: small jobs' lanes, rate-limited jobs
        whose next permit is due (their tokens back to ready), and jobs on their own
        stream (:meth:`streamq.job_work.JobWork.promote`)."""
        w = self.w
        lanes = [j for j in jobs if j.startswith(LANE_DUE)]
        if lanes:
            self.lane.promote(self.qk, lanes)
        rated = [parse_due(j) for j in jobs if j.startswith(RATE_DUE)]
        if rated:
            w.scripts.run_many([w.scripts.unpark_call(self.qk, job, n) for job, n in rated])
        self.jobs.promote([j for j in jobs if not j.startswith((LANE_DUE, RATE_DUE))])

