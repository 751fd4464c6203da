"""What a slot reads of the small-job lane, and what it takes of what a read got.

A read covers the lanes of the most urgent priority its shard's registry shows, at
most a batch in all, a fair share from each client's lane (:meth:`LaneReads.share`);
rate-limited clients' lanes are read apart, with permits (:meth:`LaneReads.take_limited`).
The running and acknowledging of what was read is :mod:`streamq.lane_work`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

import redis

from streamq.base.config import GROUP
from streamq.base.entry_fields import LaneEntry, _tiers, streams_read
from streamq.base.keys import QueueKeys
from streamq.base.members import parse_lane_member
from streamq.model.queue_view import Serving
from streamq.producer.rates import Limiter
from streamq.storage.connection import is_transient, pipelined
from streamq.work.leases import LeaseKeeper

log = logging.getLogger("streamq.worker")

#: how long a rate-limited client's lane found empty is not read again, s
QUIET_S = 0.2


class LaneReader(Serving, Protocol):
    """What lane reads need of the worker: its id and connection, its leases (the
    streams it reads are watched), its rate limits."""

    @property
    def leases(self) -> LeaseKeeper: ...
    @property
    def rates(self) -> Limiter: ...


class LaneReads:
    """The lane reads of one slot: the lanes each shard's registry showed, and what
    the last read of each covered."""

    def __init__(self, worker: LaneReader) -> None:
        self.w = worker
        #: the lanes of each shard, as its registry said in the last read
        self.lanes: dict[str, list[tuple[int, str]]] = {}
        #: the lanes the last read of each shard covered (:meth:`commands`)
        self._sent: dict[str, list[tuple[int, str]]] = {}
        #: where the last read of a tier of more lanes than its count started (:meth:`share`)
        self._turn = 0
        #: rate-limited lanes whose last read found nothing -> monotonic time to read again
        self._quiet: dict[tuple[int, str], float] = {}

    def sent(self, qk: QueueKeys) -> list[tuple[int, str]]:
        """The lanes the last read of shard ``qk`` covered."""
        return self._sent.get(qk.tag, [])

    def open_lanes(self, lanes: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
        """``lanes`` without those of rate-limited clients (read apart, with permits:
        :meth:`take_limited`)."""
        rates = self.w.rates
        if not rates.active():
            return list(lanes)
        return [lane for lane in lanes if not rates.limited(lane[1])]

    def commands(self, qk: QueueKeys, count: int) -> list[tuple[Any, ...]]:
        """The commands of a lane read on shard ``qk``: its registry, then an
        XREADGROUP of ``count`` entries of each lane of the most urgent priority known
        (none known: none)."""
        out: list[tuple[Any, ...]] = [("ZRANGE", qk.lanes, 0, -1)]
        tiers = _tiers(self.open_lanes(self.lanes.get(qk.tag, [])))
        if not tiers:
            self._sent[qk.tag] = []
            return out
        lanes, per = self.share(tiers[0], count)
        self._sent[qk.tag] = lanes
        return [*out, self.read_command(qk, lanes, per)]

    def share(self, lanes: Sequence[tuple[int, str]], count: int
              ) -> tuple[list[tuple[int, str]], int]:
        """The lanes a read of at most ``count`` entries in all covers, and how many it
        takes from each: every lane an equal share while they are fewer than ``count``,
        else ``count`` of them, one entry each, starting one lane further every read
        (so each client's lane comes up in turn). A slot never takes a whole tier of
        many clients' work at once, which would idle the other slots and workers."""
        if len(lanes) <= count:
            return list(lanes), max(1, count // max(1, len(lanes)))
        self._turn = (self._turn + count) % len(lanes)
        start = self._turn
        return [lanes[(start + k) % len(lanes)] for k in range(count)], 1

    def read_command(self, qk: QueueKeys, lanes: Sequence[tuple[int, str]], per: int
                     ) -> tuple[Any, ...]:
        """XREADGROUP of ``per`` new entries of each of ``lanes``."""
        streams = [qk.lane(p, c) for p, c in lanes]
        self.w.leases.unseen.reading(qk, streams)  # its entries held unseen: lane_unseen
        return ("XREADGROUP", "GROUP", GROUP, self.w.id, "COUNT", per,
                "STREAMS", *streams, *(">" for _ in streams))

    def take(self, qk: QueueKeys, replies: Sequence[Any], count: int
             ) -> tuple[list[LaneEntry], bool]:
        """The entries to run this round, from a lane read (:meth:`commands`) of
        ``count`` per stream, and whether more is likely waiting (a stream gave a full
        batch).

        Priority holds across lanes: a read covers the lanes of one priority (every
        client's lane of it, each giving at most ``count``: a fair share); when the
        most urgent priority has nothing new, the next is read, one round trip each,
        until one gives entries. Lanes the registry shows since the last read are read
        at once: entries of those more urgent than what was read run first."""
        known = self.lanes.get(qk.tag, [])
        read_tier = self._sent.get(qk.tag, [])
        entries, more = self.parse(qk, replies, self.share_of(read_tier, count), read_tier)
        now = self.open_lanes(self.lanes.get(qk.tag, []))
        new = [lane for lane in now if lane not in known]
        if new and (not read_tier or new[0][0] <= read_tier[0][0]):
            # a lane as urgent as what was read, or more, appeared: read it now
            urgent = min(p for p, _ in new)
            got, more_new = self._read(qk, [x for x in new if x[0] == urgent], count)
            entries, more = got + entries, more or more_new
        if not entries:
            for tier in _tiers(now):
                if read_tier and tier[0][0] < read_tier[0][0]:
                    continue  # more urgent than the tier read (empty at that time)
                if read_tier and tier[0][0] == read_tier[0][0]:
                    # the tier read: its lanes the read did not cover (a share of them)
                    tier = [lane for lane in tier if lane not in read_tier]
                    if not tier:
                        continue
                entries, more = self._read(qk, tier, count)
                if entries:
                    break
        entries.sort(key=lambda e: e.priority)
        return entries, more

    def take_limited(self, qk: QueueKeys, count: int) -> tuple[list[LaneEntry], bool]:
        """The entries of rate-limited clients' lanes of shard ``qk`` to run this round:
        permits first (up to ``count`` per lane), then one read per lane of as many
        entries as it was granted, the permits not used given back; and whether a lane
        gave all it was granted. A client left without permits is not read until its
        next permit is due; a lane found empty, not for QUIET_S."""
        rates, now = self.w.rates, time.monotonic()
        lanes = [lane for lane in self.lanes.get(qk.tag, [])
                 if rates.limited(lane[1]) and not rates.throttled(lane[1])
                 and self._quiet.get(lane, 0.0) <= now]
        if not lanes:
            return [], False
        grants = rates.take([(c, count) for _, c in lanes])
        got = [(lane, n) for lane, (n, _) in zip(lanes, grants) if n > 0]
        for (_, client), (n, wait) in zip(lanes, grants):
            if n < count:
                rates.throttle(client, wait)
        if not got:
            return [], False
        replies = pipelined(self.w.redis, [self.read_command(qk, [lane], n) for lane, n in got])
        entries: list[LaneEntry] = []
        more, unused = False, []
        for (lane, n), reply in zip(got, replies):
            found, _ = self.parse(qk, [None, reply], n, [lane])
            entries += found
            more = more or len(found) >= n
            if not found:
                self._quiet[lane] = now + QUIET_S
            if len(found) < n:
                unused.append((lane[1], n - len(found)))
        rates.give_back(unused)
        return entries, more

    def _read(self, qk: QueueKeys, lanes: Sequence[tuple[int, str]], count: int
              ) -> tuple[list[LaneEntry], bool]:
        """One XREADGROUP of ``lanes``, at most ``count`` entries in all (a round trip of
        its own)."""
        lanes, per = self.share(lanes, count)
        reply = pipelined(self.w.redis, [self.read_command(qk, lanes, per)])
        return self.parse(qk, [None, *reply], per, lanes)

    @staticmethod
    def share_of(lanes: Sequence[tuple[int, str]], count: int) -> int:
        """The entries per lane of a read of ``lanes`` chosen by :meth:`share`."""
        return max(1, count // max(1, len(lanes))) if len(lanes) <= count else 1

    def parse(self, qk: QueueKeys, replies: Sequence[Any], count: int,
              read_lanes: Sequence[tuple[int, str]]) -> tuple[list[LaneEntry], bool]:
        """The entries a lane read of ``count`` per stream of ``read_lanes`` got
        (``replies``: the registry's, None for none, then the read's, if any), and
        whether a stream gave a full batch. The registry's reply replaces the shard's
        known lanes."""
        registry, *read = replies
        known = list(read_lanes)
        if isinstance(registry, Exception):
            if is_transient(registry):
                raise registry
        elif registry is not None:
            self.lanes[qk.tag] = [parse_lane_member(m.decode() if isinstance(m, bytes) else m)
                                  for m in registry]
        out: list[LaneEntry] = []
        full = False
        if read:
            reply = read[0]
            if isinstance(reply, redis.ResponseError):
                if is_transient(reply):
                    raise reply
                # NOGROUP: a lane stream removed under us (the reaper drops idle lanes:
                # expected, so not a warning); the registry is read again
                expected = str(reply).startswith("NOGROUP")
                log.log(logging.DEBUG if expected else logging.WARNING,
                        "lane read failed on %s: %s", qk.tag, reply)
                reply = None
            elif isinstance(reply, Exception):
                raise reply
            by_stream = {qk.lane(p, c): (p, c) for p, c in known}
            for stream, entries in streams_read(reply):
                p, c = by_stream.get(stream, (0, ""))
                full = full or len(entries) >= count
                out.extend(LaneEntry(p, c, stream, eid.decode(), flat) for eid, flat in entries)
        return out, full
