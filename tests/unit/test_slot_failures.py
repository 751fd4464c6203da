"""What a slot does after a round that failed (streamq/work/slot_failures.py): no server."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from streamq.work.slot_failures import PAUSE_FIRST_S, PAUSE_MAX_S, Failures


class _Worker:
    """The parts of a worker a slot's failures read and write."""

    def __init__(self, stop_retry_s: float = 30.0) -> None:
        self.undrained = 0
        self.gave_up = False
        self.stop_retry_s = stop_retry_s
        self.fatal: list[BaseException] = []
        self.down: list[BaseException] = []
        self.pauses: list[tuple[bool, float]] = []

    def fatal_error(self, e: BaseException) -> None:
        self.fatal.append(e)

    def unreachable(self, e: BaseException) -> None:
        self.down.append(e)

    def pause(self, stopping: bool, seconds: float) -> None:
        self.pauses.append((stopping, seconds))


REFUSED = redis.exceptions.NoPermissionError("NOPERM this user has no permissions")
DOWN = redis.exceptions.ConnectionError("Error 111 connecting")
ODD = redis.exceptions.ResponseError("ERR something unexpected")


def test_refused_access_stops_the_worker_then_gives_up_when_refused_again_while_stopping(
) -> None:
    w = _Worker()
    f = Failures(w, threading.Lock())
    # a round before the stop: the worker stops, the slot tries once more to hand back
    assert f.failed(REFUSED, False, None, 2) is False
    assert w.fatal == [REFUSED] and w.pauses == []
    # refused again while stopping: it gives up at once, its tokens left to their leases
    assert f.failed(REFUSED, True, time.monotonic(), 2) is True
    assert (w.undrained, w.gave_up) == (2, False)


def test_a_transient_error_backs_off_doubling_to_its_longest_pause() -> None:
    w = _Worker()
    f = Failures(w, threading.Lock())
    for _ in range(6):
        assert f.failed(DOWN, False, None, 0) is False
    waits = [s for _, s in w.pauses]
    assert waits[0] == PAUSE_FIRST_S and waits[-1] == PAUSE_MAX_S
    assert all(b == min(PAUSE_MAX_S, 2 * a) for a, b in zip(waits, waits[1:]))
    assert len(w.down) == 6
    f.ok()
    assert f.pause == PAUSE_FIRST_S


@pytest.mark.parametrize("error, unreachable", [(DOWN, True), (ODD, False)])
def test_a_stopping_slot_gives_up_after_the_stop_retry_whatever_the_error(
        error: Exception, unreachable: bool) -> None:
    w = _Worker(stop_retry_s=5.0)
    f = Failures(w, threading.Lock())
    # within the stop retry it retries (an unexpected error pauses 1 s, at most 0.5 s
    # once stopping: the worker's pause)
    assert f.failed(error, True, time.monotonic(), 1) is False
    # past it, it gives up; only a transient error marks Redis unreachable (the worker
    # then starts no more calls)
    assert f.failed(error, True, time.monotonic() - 6.0, 1) is True
    assert (w.undrained, w.gave_up) == (1, unreachable)


def test_an_unexpected_error_pauses_a_second_and_is_not_counted_as_unreachable() -> None:
    w = _Worker()
    f = Failures(w, threading.Lock())
    assert f.failed(ODD, False, None, 0) is False
    assert w.pauses == [(False, 1.0)] and w.down == [] and w.fatal == []
