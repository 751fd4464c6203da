"""A worker slot's share of the small-job lane (:mod:`streamq.lane`).

Each round trip of a slot's settle also reads the lanes of the shard it claims
from: the shard's registry of lanes (for the next round) and one XREADGROUP
over every lane stream it knows, so each client's stream gives a fair share.
The entries are run in priority order, around the claimed tokens' work (a
more urgent lane runs first), by the runners that run a job's entries
(:mod:`streamq.work.entries`, :mod:`streamq.work.async_entries`), through the
lane's source (:class:`streamq.work.sources.LaneSource`): their results are
acknowledged by one ``lane_ack`` call per stream, sent in the slot's next
settle (or at once every ``ack_flush_s``): that one script acks, stores the
results, completes the jobs and records and publishes each completion. A
failure is reported at once (``lane_fail``: a retry with backoff, or a dead
letter). A suspect entry (re-added by the reaper, or a retry) has its start
recorded first, so a kill inside its handler counts an attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from streamq.base import hooks
from streamq.base.entry_fields import LaneEntry, is_suspect
from streamq.base.keys import QueueKeys
from streamq.base.members import parse_lane_member
from streamq.base.replies import Call
from streamq.work.entries import EntryRunner, EntryWorker
from streamq.work.lane_reads import LaneReads
from streamq.work.sources import LaneAcks, LaneSource, requeue_lane

if TYPE_CHECKING:
    from streamq.producer.rates import Limiter
    from streamq.work.leases import SlotHold

log = logging.getLogger("streamq.worker")

#: the prefix of a lane's member in a shard's ``retries`` (never a job id: ``|``)
LANE_DUE = "lane|"


class LaneWorker(EntryWorker, Protocol):
    """What a slot's lane work reads of the worker."""

    @property
    def entries(self) -> EntryRunner: ...
    @property
    def rates(self) -> Limiter: ...
    @property
    def slot_share(self) -> int: ...


class LaneWork:
    """The lane reads, runs and acknowledgements of one slot (``hold``: what it holds)."""

    def __init__(self, worker: LaneWorker, hold: SlotHold) -> None:
        self.hold = hold
        self.w = worker
        #: what to read of the shard's lanes, and what a read got (:mod:`streamq.lane_reads`)
        self.reads = LaneReads(worker)
        #: results waiting for their acknowledgement (sent with the next settle)
        self.pending = LaneAcks(worker, hold)
        #: the lane_ack calls of :attr:`pending` (the slot's settle sends them)
        self.acks: list[Call] = self.pending.calls

    def hand_back(self, qk: QueueKeys, replies: Sequence[Any], count: int) -> None:
        """Give back, unstarted, what a lane read (:meth:`LaneReads.commands`) got in a round
        trip whose settle found the queue paused (or failed, or whose wait the stop cut
        short)."""
        entries, _ = self.reads.parse(qk, replies, count, self.reads.sent(qk))
        if entries:
            requeue_lane(self.w, qk, entries)

    def taken(self, qk: QueueKeys, replies: list[Any], count: int, paused: bool
              ) -> tuple[list[LaneEntry], bool]:
        """The lane entries a settle's round trip read (handed back with ``paused``: it
        found the queue paused, failed, or the stop came while it waited), with those
        of rate-limited clients that got permits; and whether there is more to read (a
        read filled its batch, or a lane was not covered)."""
        if paused:  # handed back unstarted
            self.hand_back(qk, replies, count)
            return [], False
        lanes, more = self.reads.take(qk, replies, count)
        if self.w.rates.active():  # rate-limited clients' lanes: permits, then reads
            limited, more_limited = self.reads.take_limited(qk, count)
            if limited:
                lanes = sorted(lanes + limited, key=lambda e: e.priority)
            more = more or more_limited
        return lanes, more

    def run(self, qk: QueueKeys, entries: list[LaneEntry]) -> None:
        """Run lane entries in order, as a job's entries run
        (:mod:`streamq.work.entries`); their results wait in :attr:`acks` for the next
        settle (a failure is reported at once). Two lane streams may give one id to two
        entries of one read (the runner knows an entry by its id): such entries run in
        turns, each group of distinct ids after the one before, none handed back (a
        rate-limited client's entry was read on a permit it would lose)."""
        for group in _distinct_groups(entries):
            self._run(qk, group)

    def _run(self, qk: QueueKeys, entries: list[LaneEntry]) -> None:
        w = self.w
        waits: list[float] = []
        durations: list[float] = []
        held = w.leases.track(self.hold, _by_stream(entries),
                              {(e.stream, e.eid): e.flat for e in entries})
        unacked = {stream: ids for (stream, _), ids in zip(_by_stream(entries), held)}
        hooks.at("after_read")
        src = LaneSource(w, qk, entries, unacked, self.pending)
        reads, ids = LaneSource.reads(entries), [e.eid for e in entries]
        if w.loop is not None and not any(is_suspect(e.flat) for e in entries):
            # an async handler: every small job at once, the slot's share at a time
            ran = w.async_entries.run([(src, [r], [i]) for r, i in zip(reads, ids)], waits,
                                      durations, max(1, w.slot_share))
            done = [d for results, _ in ran for d in results]
        else:
            done, _ = w.entries.run_entries(src, reads, ids, waits, durations)
        w.outcomes.observe(waits, durations)
        self.pending.add(qk, src.results(done))

    def acked(self, replies: Sequence[Any]) -> None:
        """Count the replies of lane_ack calls (every call of :attr:`acks`)."""
        self.pending.acked(replies)

    def promote(self, qk: QueueKeys, members: Sequence[str]) -> None:
        """Promote the due retries of lanes ``members`` (``lane|<prio>|<client>``)."""
        calls = [self.w.scripts.lane_promote_call(qk, parse_lane_member(m[len(LANE_DUE):]))
                 for m in members]
        self.w.scripts.run_many(calls)


def _by_stream(entries: Sequence[LaneEntry]) -> list[tuple[str, list[str]]]:
    out: dict[str, list[str]] = {}
    for e in entries:
        out.setdefault(e.stream, []).append(e.eid)
    return list(out.items())


def _distinct_groups(entries: list[LaneEntry]) -> list[list[LaneEntry]]:
    """``entries`` in groups of distinct ids, in order: an entry goes to the first group
    that has no entry of its id (one group, unless two lanes gave one id)."""
    if entries and len({e.eid for e in entries}) == len(entries):
        return [entries]  # (the usual case: one stream's ids, or distinct ones)
    groups: list[list[LaneEntry]] = []
    ids: list[set[str]] = []
    for e in entries:
        k = next((k for k, seen in enumerate(ids) if e.eid not in seen), len(groups))
        if k == len(groups):
            groups.append([])
            ids.append(set())
        groups[k].append(e)
        ids[k].add(e.eid)
    return groups
