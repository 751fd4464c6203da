"""A slot's round trip as an object: each part of a worker's round adds its calls (server
functions, run in the order added) or its plain commands (sent after every call, in
the order added; a command to wait with, :meth:`RoundTrip.first`, before them all)
and gets back a :class:`Part`; after :meth:`RoundTrip.send`, each part
holds its own replies. No part reads another's replies, and none counts positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from streamq.base.entry_fields import Batch
from streamq.base.keys import QueueKeys
from streamq.base.members import token_job
from streamq.base.replies import Call, JobReply

#: a job an acknowledgement completed, its reply and the shard it lives on
Finish = tuple[str, JobReply, QueueKeys]


class Runs(Protocol):
    """What a round trip sends through: :meth:`streamq.script_base.ScriptBase.run_then`."""

    def run_then(self, calls: Sequence[Call], commands: Sequence[Sequence[Any]] = (),
                 first: Sequence[Sequence[Any]] = ()) -> tuple[list[Any], list[Any]]: ...


class Part:
    """What one part of a round sent, and, once the round trip went, its replies (a
    command's error reply in its place; a call's error raises at :meth:`RoundTrip.send`)."""

    __slots__ = ("sent", "replies")

    def __init__(self, sent: int) -> None:
        self.sent = sent
        self.replies: list[Any] = []

    def __bool__(self) -> bool:
        return self.sent > 0


class RoundTrip:
    """One pipelined write: calls first, then commands; see the module's docstring."""

    def __init__(self, scripts: Runs) -> None:
        self._scripts = scripts
        self._calls: list[Call] = []
        self._commands: list[Sequence[Any]] = []
        self._first: list[Sequence[Any]] = []
        self._parts: list[tuple[Part, bool]] = []  # (part, its entries are calls)

    def calls(self, calls: Sequence[Call]) -> Part:
        """Add server-function calls; their part."""
        self._calls.extend(calls)
        return self._add(len(calls), True)

    def commands(self, commands: Sequence[Sequence[Any]]) -> Part:
        """Add plain commands, sent after every call; their part."""
        self._commands.extend(commands)
        return self._add(len(commands), False)

    def first(self, *commands: Sequence[Any]) -> Part:
        """Commands sent, in this order, before every call and command, such as a
        ``BLPOP`` that holds the rest of the round trip until it returns; their part
        (one per round trip)."""
        if self._first:
            raise ValueError("a round trip has one part of first commands")
        self._first.extend(commands)
        part = Part(len(commands))
        self._parts.insert(0, (part, False))
        return part

    def _add(self, n: int, call: bool) -> Part:
        part = Part(n)
        self._parts.append((part, call))
        return part

    def send(self) -> None:
        """Send everything added in one round trip and give each part its replies."""
        replies, after = self._scripts.run_then(self._calls, self._commands, self._first)
        at = {True: 0, False: 0}
        for part, call in self._parts:
            got = replies if call else after
            part.replies = got[at[call]: at[call] + part.sent]
            at[call] += part.sent


class Carried:
    """What a slot's round leaves to the next round's settle."""

    def __init__(self) -> None:
        #: tokens to release or keep, with the code the settle gives each
        self.settled: list[tuple[str, str]] = []
        #: jobs the last acknowledgements completed, finished with the next settle
        self.finishes: list[Finish] = []
        #: jobs whose last read was a full batch: their next batch is read in the round
        #: trip of the next settle, and served at once if that settle gives a token back
        self.follow: list[str] = []
        #: results of followed jobs, acknowledged first in the round trip of the next settle
        self.acks: list[Batch] = []

    def held(self, lane_acks: list[Any]) -> bool:
        """Whether anything is left to hand back (``lane_acks``: the lane's results)."""
        return bool(self.settled or self.finishes or self.acks or lane_acks)


def finishing(settled: list[tuple[str, str]], finishes: list[Finish], trip: RoundTrip,
              finish_call: Callable[[list[tuple[str, JobReply]], QueueKeys], Call]
              ) -> list[tuple[str, str]]:
    """Add the calls that finish ``finishes`` in their shards to ``trip`` (``finish_call``:
    the queue's call finishing jobs of one shard); return ``settled`` without the drops
    they make needless."""
    # finishing a job removes its tokens (now, or when it was finished before):
    # a token of a job finished here needs no drop of its own
    done = {job for job, _, _ in finishes}
    by_shard: dict[QueueKeys, list[tuple[str, JobReply]]] = {}
    for job, reply, qk in finishes:
        by_shard.setdefault(qk, []).append((job, reply))
    trip.calls([finish_call(jobs, qk) for qk, jobs in by_shard.items()])
    return [(t, m) for t, m in settled if m != "d" or token_job(t) not in done]
