"""The plumbing of :class:`streamq.scripts.Scripts`: script registration and calls.

Scripts are the functions of streamq's library (:func:`streamq.luaload.library`),
run with FCALL, or with SQ.FCALL where streamq's Redis module is loaded (so that
the roles need no write command of their own: :mod:`streamq.roles`). A server
found without the library (a restart without persistence, FUNCTION FLUSH, a new
master) gets it again when the user may load it
(:func:`streamq.functions.ensure`); else the call fails with what to run. One
found without the module it had is asked again which call to use.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from streamq.base.replies import Call
from streamq.storage import functions
from streamq.storage.connection import Client, InFlight, is_transient, pipelined
from streamq.storage.contracts import CONTRACTS
from streamq.storage.luaload import bundled, library

#: check every call against its declared contract before it is sent (the test suite
#: sets ``STREAMQ_CHECK_CONTRACTS=1``: a stub that disagrees with its declaration
#: fails there; the functions check every call themselves, whatever this says)
CHECK_CONTRACTS = os.environ.get("STREAMQ_CHECK_CONTRACTS", "") not in ("", "0")


class ScriptsBase:
    """A Redis client and streamq's scripts registered on it."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.library = library()
        self._numkeys = {name: lua.numkeys for name, lua in bundled().items()}
        #: FCALL or SQ.FCALL (:func:`streamq.functions.call_command`), asked at first use
        self._call: str | None = None
        #: seconds to send again the calls Redis refused with a transient reply (they
        #: did not run); 0: raised at once, for a caller that waits in its own loop
        self.outlast_s = 0.0

    def function(self, name: str) -> str:
        """The library function that runs the script ``name`` (the FCALL's first
        argument)."""
        return self.library.functions[name]

    def run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run one script (FCALL)."""
        return self.run_many([Call(name, keys, args)])[0]

    def run_many(self, calls: Sequence[Call]) -> list[Any]:
        """Run several scripts in one pipelined round trip; replies in order.

        A function the server does not have did not run: the library is loaded
        (:func:`streamq.functions.ensure`, which raises when this user may not)
        and the calls it failed are run again, in one more round trip (twice at
        most, in case it was flushed again meanwhile). Any other error is raised.
        """
        return self.run_then(calls)[0]

    def run_then(self, calls: Sequence[Call], commands: Sequence[Sequence[Any]] = (),
                 first: Sequence[Sequence[Any]] = ()) -> tuple[list[Any], list[Any]]:
        """:meth:`run_many`, with plain ``commands`` sent after the scripts in the
        same round trip, and ``first`` before them; returns the scripts' replies and
        the raw replies of ``first`` then ``commands`` (an error reply of a command is
        returned in its place, not raised). The commands run once, with the scripts'
        first attempt. A blocking command in ``first`` (BLPOP) holds the rest of the
        round trip until it returns: Redis reads a blocked client's next commands
        only then."""
        if not calls and not commands and not first:
            return [], []
        sent = self._pipelined(calls, commands, first)
        before, replies = sent[: len(first)], sent[len(first): len(first) + len(calls)]
        return self._settled(calls, replies), [*before, *sent[len(first) + len(calls):]]

    def send_many(self, calls: Sequence[Call]) -> Callable[[], list[Any]]:
        """Send several scripts in one batch now and return a function that reads
        their replies (as :meth:`run_many` returns them) when called: Redis runs the
        batch while the caller prepares the next. For idempotent scripts only: a
        batch whose connection breaks is sent again."""
        flight = InFlight(self.client, self._commands(calls))
        return lambda: self._settled(calls, flight.wait())

    def _settled(self, calls: Sequence[Call], replies: list[Any]) -> list[Any]:
        """Run again the calls whose function was missing (or whose server lost the
        module: a restart without it), raise errors."""
        for _ in range(2):
            missing = [i for i, r in enumerate(replies) if functions.is_missing_function(r)
                       or functions.is_missing_module(r)]
            if not missing:
                break
            if any(functions.is_missing_module(replies[i]) for i in missing):
                self._call = self.client.streamq_call = None  # type: ignore[union-attr]
            self.client.streamq_library = None  # type: ignore[union-attr]
            functions.ensure(self.client, self.library)
            for i, reply in zip(missing, self._pipelined([calls[i] for i in missing])):
                replies[i] = reply
        self._outlast(calls, replies)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _outlast(self, calls: Sequence[Call], replies: list[Any]) -> None:
        """Send again, with backoff for up to :attr:`outlast_s`, the calls Redis refused
        with a transient reply (BUSY, LOADING, OOM, READONLY...: refused before they
        ran), in place in ``replies``."""
        deadline, pause = time.monotonic() + self.outlast_s, 0.05
        while self.outlast_s > 0:
            again = [i for i, r in enumerate(replies)
                     if isinstance(r, Exception) and is_transient(r)]
            if not again or time.monotonic() + pause > deadline:
                return
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
            for i, reply in zip(again, self._pipelined([calls[i] for i in again])):
                replies[i] = reply

    def _commands(self, calls: Sequence[Call]) -> list[Sequence[Any]]:
        commands: list[Sequence[Any]] = []
        word = self._call
        if word is None and calls:
            word = self._call = functions.call_command(self.client)
        for c in calls:
            if len(c.keys) != self._numkeys[c.name]:
                raise ValueError(f"{c.name} takes {self._numkeys[c.name]} keys, got {len(c.keys)}")
            if CHECK_CONTRACTS:
                CONTRACTS[c.name].check(c.keys, c.args)
            commands.append((word, self.library.functions[c.name], len(c.keys), *c.keys,
                             *c.args))
        return commands

    def _pipelined(self, calls: Sequence[Call], then: Sequence[Sequence[Any]] = (),
                   first: Sequence[Sequence[Any]] = ()) -> list[Any]:
        """The commands ``first``, then FCALL each call, then the commands ``then``, in
        one round trip; errors are returned, not raised."""
        return pipelined(self.client, [*first, *self._commands(calls), *then])
