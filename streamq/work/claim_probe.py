"""Whether a slot that holds no token sends its settle call this round.

A slot's settle releases the tokens it holds and claims new ones, takes the jobs
whose retries are due and notes a pause (settle-11.lua). On a shard with no
ready token, no retry waiting and no pause, a slot that holds no token gets
nothing from it: a queue of small jobs only is served by the lane reads of the
same round trip. So every round that claims also reads whether the shard has
any of the three (:meth:`ClaimProbe.commands`: one ``EXISTS``); after a round in
which it had none, a slot that holds nothing sends that read instead of the
settle (:meth:`ClaimProbe.skips`), and sends the settle in a second round trip
only when the read finds one of them (:meth:`ClaimProbe.settle_now`). A settle skipped
is one that would have claimed nothing, taken nothing and noted nothing.

While a retry waits (its due time is the settle's to judge, by Redis's clock)
or tokens are ready, every round sends its settle with the read, as it would
without one. A settle also leaves the slot's memo (``settle:<owner>``) in its worker's hash,
by which ``Queue.pause`` knows the slot and waits for its note: a slot's first
settle is always sent, and the read of a round that skips it also asks whether the
memo is there, so a memo lost with the hash (beats failing past its lifetime, a
Redis restart that lost data) is written again by the next round's settle.
"""

from __future__ import annotations

from typing import Any

from streamq.base.keys import QueueKeys
from streamq.base.members import owner
from streamq.base.replies import SettleReply
from streamq.work.round_trip import Part

#: the reply of a settle not sent: nothing claimed, nothing due, no retry waiting
NOTHING = SettleReply([], [], -1, False)


class ClaimProbe:
    """One slot's knowledge of whether its next settle could do anything (see the
    module's docstring)."""

    def __init__(self, worker_id: str, slot: int) -> None:
        self._worker = worker_id
        #: the field of the slot's settle memo in its worker's hash
        self._memo = f"settle:{owner(worker_id, slot)}"
        #: the shard whose last read found no ready token, retry or pause (None: none)
        self._quiet: QueueKeys | None = None

    def commands(self, qk: QueueKeys, memo: bool) -> list[tuple[Any, ...]]:
        """The read: how many of the shard's ready tokens, retries and pause exist, and,
        with ``memo`` (a round sending no settle: one that does writes the memo),
        whether the slot's settle memo is in its worker's hash there."""
        exists = ("EXISTS", qk.ready, qk.retries, qk.paused)
        return [exists, ("HEXISTS", qk.worker(self._worker), self._memo)] if memo else [exists]

    def skips(self, qk: QueueKeys) -> bool:
        """Whether a round that claims from ``qk`` and holds nothing sends the read
        instead of the settle (the last read there found nothing for a settle)."""
        return self._quiet is qk

    def settle_now(self, qk: QueueKeys, settle: Part, read: Part) -> bool:
        """Note what a round trip to ``qk`` sent and got (``settle``, ``read``: the parts
        of :class:`streamq.work.round_trip.RoundTrip` holding the settle call, if any,
        and the read, if any); whether the settle must be sent now: it was not, and
        the read found something it would act on, or no memo (an error reply counts as
        found)."""
        if not read:
            self._quiet = None  # (a round that claims nothing sends no read)
            return False
        found_any, *memo = read.replies
        found = any(isinstance(r, Exception) for r in read.replies) or int(found_any) > 0 \
            or (bool(memo) and int(memo[0]) == 0)
        self._quiet = None if found else qk
        return found and not settle
