"""An ``async def`` handler's timeout bounds what is kept (no server)."""

from __future__ import annotations

import asyncio

import pytest

from streamq.errors import HandlerTimeout
from streamq.watchdog import guarded


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
