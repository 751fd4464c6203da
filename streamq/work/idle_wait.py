"""How an idle slot waits for work, and which wake-up signals it drops.

On a queue of one shard the wait is a ``BLPOP`` of the shard's wake list at the
head of the slot's next round trip: Redis reads a blocked client's next commands
only once the ``BLPOP`` returns, so the reads behind it (the lanes, the probe, a
settle) run at the wake-up and reach the slot in the same reply.

A submit pushes a signal per job (up to ``config.WAKE_CAP`` waiting), so that N idle
slots wake for N slow jobs; a slot that wakes reads a batch and takes one. Under a
steady load the rest stay, and a slot that finds nothing would pop the next stale
signal at once, polling them one round trip each. So every round trip that claims
ends with an ``LLEN`` of the list, after its reads; when the round found nothing a
signal announces (no lane entry, no ready token; a pause's signals are left to the
slots that must note it), the signals counted are stale, and the next wait drops
that many of the oldest (``RPOP``) right after its ``BLPOP`` returns (at once: they
are there). The drop goes before the reads, with nothing that blocks between: a
signal it takes that was not stale (pushed between the reads and the count, or left
by other slots' pops) announced work added before it, which those reads see.
On a queue of several shards the count is made the same way, and the shard's waker
thread drops the stale signals (:class:`streamq.services.wakers.Wakers`).
"""

from __future__ import annotations

from typing import Any

from streamq.base.keys import QueueKeys
from streamq.work.round_trip import Part, RoundTrip


class IdleWait:
    """One slot's wait on its shard's wake list (see the module's docstring)."""

    def __init__(self) -> None:
        #: the next round trip begins by waiting this long, s (None: it does not wait)
        self._wait_s: float | None = None
        #: signals the next wait drops first
        self._stale = 0
        self._waited: Part | None = None
        self._count = Part(0)
        #: wake-up signals in the list after the last round trip's reads
        self.signals = 0
        #: the stop came while the last round trip waited: what it read goes back
        self.stopped = False

    def arm(self, timeout: float, found_nothing: bool) -> None:
        """Make the next round trip wait up to ``timeout`` s; ``found_nothing``: the
        last round found nothing a signal announces, so the signals it counted go."""
        self._wait_s, self._stale = timeout, self.stale(found_nothing)

    def stale(self, found_nothing: bool) -> int:
        """The signals the last round counted, if it found nothing a signal announces."""
        return self.signals if found_nothing else 0

    def add(self, trip: RoundTrip, qk: QueueKeys, claim: int, holding: bool) -> None:
        """Add to ``trip`` (to shard ``qk``) the armed wait, when the slot claims and
        holds nothing (what it holds is settled at once), and, when it claims, the
        count of signals after the reads (with several shards, the stale ones go to
        the shard's waker: :meth:`streamq.services.wakers.Wakers.stale`)."""
        wait_s, stale, self._wait_s, self._stale = self._wait_s, self._stale, None, 0
        self._waited = None
        if wait_s is not None and claim > 0 and not holding:
            drop: list[tuple[Any, ...]] = [("RPOP", qk.wake, stale)] if stale > 0 else []
            self._waited = trip.first(("BLPOP", qk.wake, wait_s), *drop)
        self._count = trip.commands([("LLEN", qk.wake)] if claim > 0 else [])

    def note(self, stopping: bool) -> None:
        """Take the round trip's replies (``stopping``: the worker is stopping now)."""
        self.stopped = self._waited is not None and stopping
        self.signals = next((n for n in self._count.replies if isinstance(n, int)), 0)
