"""Acknowledgements a slot sends without waiting for them.

A slot that goes on serving sends the acknowledgements of a round (the lane's
``lane_ack`` calls and the big jobs' ``ack`` calls) right after the round trip
that settles its tokens and reads its next work, on a connection of their own
(:class:`streamq.connection.InFlight`), and reads their replies at its next
settle. Redis runs those scripts while the slot's handlers run the next
entries, instead of the slot waiting for them inside its settle.

Nothing about what an acknowledgement promises changes: an entry counts as
done when its acknowledgement has run, as before, and a worker killed with
acknowledgements in flight leaves their entries pending (the reaper hands
them on, as it does for results a worker never sent). Jobs the replies
report completed are finished with the settle that reads them, as before.
Replies that cannot be read (a transient error) leave the flight in place:
the next settle sends its calls again, whole (acknowledging is idempotent:
an entry acknowledged twice counts once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .entries import Batch
from .keys import QueueKeys
from .replies import Call
from .scripts import JobReply
from .tracing import EntryKey

if TYPE_CHECKING:
    from .slot import Finish, Slot


@dataclass
class Flight:
    """One batch of acknowledgements sent and not yet read."""

    #: reads the replies (the lane's calls first, then the jobs' ack calls)
    read: Callable[[], list[Any]]
    #: the lane_ack calls, then the jobs' ack calls, as sent
    calls: list[Call]
    #: how many of ``calls`` are lane_ack calls
    lane: int
    #: the jobs' results the ack calls acknowledge
    batches: list[Batch]
    #: the shard whose tokens the slot held when it served them (finishes go there)
    shard: QueueKeys
    #: lane entries acknowledged, for their ack spans (tracing on)
    traced: list[EntryKey]


class AckFlights:
    """The acknowledgements one slot has in flight (at most one batch)."""

    def __init__(self, slot: Slot) -> None:
        self.s = slot
        self.flight: Flight | None = None

    def __bool__(self) -> bool:
        return self.flight is not None

    def send(self, lane_calls: list[Call], batches: list[Batch], shard: QueueKeys) -> None:
        """Send ``lane_calls`` and the ack calls of ``batches`` now; their replies are
        read by :meth:`collect`."""
        w, lane = self.s.w, self.s.lane
        scripts = w.scripts
        calls = [*lane_calls, *(scripts.ack_call(jk, done) for jk, done in batches)]
        try:
            read = scripts.send_many(calls)
        except Exception:  # noqa: BLE001 - no connection now: the next settle sends them
            # (the settle whose round trip came before has its reply: it must be kept)
            def read() -> list[Any]:
                return scripts.run_many(calls)
        traced, lane.traced = lane.traced, []
        self.flight = Flight(read, calls, len(lane_calls), list(batches), shard, traced)

    def collect(self, finishes: list[Finish]) -> bool:
        """Read the replies of the batch in flight, if any: count what they
        acknowledged and add the jobs they completed to ``finishes``. Returns
        whether a batch was read. A failure to read leaves the batch to be sent
        again by the next call, and is raised."""
        f = self.flight
        if f is None:
            return False
        try:
            replies = f.read()
        except Exception:
            scripts, calls = self.s.w.scripts, f.calls

            def again() -> list[Any]:
                return scripts.run_many(calls)  # sent again, whole

            f.read = again
            raise
        self.s.lane.acked(replies[: f.lane], f.traced)
        completed: list[tuple[str, JobReply]] = []
        self.s.run_entries.acked(f.batches, replies[f.lane:], completed)
        finishes.extend((job, r, f.shard) for job, r in completed)
        self.flight = None
        return True
