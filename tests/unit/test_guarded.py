"""A handler's timeout bounds what is kept, async (``guarded``) or sync (``Watchdog``);
no server."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from streamq.errors import HandlerTimeout
from streamq.services import watchdog
from streamq.services.watchdog import Watchdog, guarded


async def _stubborn(total_s: float) -> str:
    """A handler that swallows its cancellation and returns late."""
    end = asyncio.get_running_loop().time() + total_s
    while (left := end - asyncio.get_running_loop().time()) > 0:
        try:
            await asyncio.sleep(left)
        except asyncio.CancelledError:
            pass
    return "late"


def test_a_result_returned_after_the_timeout_is_not_kept() -> None:
    # Given a handler with a 0.05 s timeout that swallows its cancellation and returns
    # at 0.3 s, within the grace a slot gives it
    # When it is awaited as a slot awaits it (several tokens of a slot at once included)
    async def two_tokens() -> list[object]:
        return await asyncio.gather(guarded(_stubborn(0.3), 0.05), guarded(_stubborn(0.0), 0.05),
                                    return_exceptions=True)
    late, quick = asyncio.run(two_tokens())
    # Then the late one is a timeout, not a success, and the quick one succeeds
    assert isinstance(late, HandlerTimeout)
    assert quick == "late"


def test_a_handler_that_never_gives_up_is_given_up() -> None:
    async def one() -> object:
        return await guarded(_stubborn(1.5), 0.05)

    with pytest.raises(HandlerTimeout):
        asyncio.run(one())


def test_a_handler_within_its_timeout_keeps_its_result_and_own_errors() -> None:
    async def ok() -> str:
        return "ok"

    async def own_timeout() -> str:
        raise TimeoutError("its own")

    assert asyncio.run(guarded(ok(), 1.0)) == "ok"
    with pytest.raises(TimeoutError, match="its own"):
        asyncio.run(guarded(own_timeout(), 1.0))


def test_what_a_handler_returned_after_its_deadline_is_not_kept_however_late_the_loop_saw_it(
) -> None:
    # Given an async handler that holds the event loop past its 0.1 s deadline (a busy
    # machine: the loop's timer fires late), then returns
    async def held() -> str:
        time.sleep(0.3)
        return "late"

    # When it is awaited with its timeout, the loop seeing it done before its timer
    # Then what it returned after its deadline is a timeout, not a success
    with pytest.raises(HandlerTimeout):
        asyncio.run(guarded(held(), 0.1))


def test_a_sync_run_times_out_at_its_own_deadline_however_late_its_slot_waits() -> None:
    w = Watchdog()
    # Given a run with a 0.1 s timeout whose slot is held up 0.15 s before it waits
    # (the deadline is the run's, as its task tells the handler, not the wait's)
    started = time.perf_counter()
    time.sleep(0.15)
    # When its handler returns at once, after that deadline
    # Then it is a timeout and its value is not kept
    with pytest.raises(HandlerTimeout):
        w.call(lambda p: p, "late", 0.1, started + 0.1)
    # And a run within its deadline keeps its value
    assert w.call(lambda p: p, "ok", 1.0, time.perf_counter() + 1.0) == "ok"
    w.stop()


class _WakesOnlyWhenSet(threading.Event):
    """A slot thread descheduled past its deadline: its wait returns only once the
    handler is done, and says it is done although the deadline passed meanwhile."""

    def wait(self, timeout: float | None = None) -> bool:
        return super().wait(None)


class _LateBox(watchdog._Box):
    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.done = _WakesOnlyWhenSet()


def test_a_sync_value_returned_past_its_deadline_is_not_kept_when_its_slot_wakes_late(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a slot whose wait wakes only when its handler is done (the machine held the
    # slot thread past the run's deadline)
    monkeypatch.setattr(watchdog, "_Box", _LateBox)
    w = Watchdog()
    # When the handler returns 0.3 s into a run with a 0.1 s timeout
    # Then it is a timeout and its value is not kept
    with pytest.raises(HandlerTimeout):
        w.call(lambda p: (time.sleep(0.3), p)[1], "late", 0.1)
    # And a run that returns within its deadline keeps its value
    assert w.call(lambda p: p, "ok", 5.0) == "ok"
    w.stop()
