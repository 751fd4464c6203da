"""How many sync slots serve (streamq.governor): moved by measured throughput, so a
worker started without --concurrency serves a waiting handler with more threads
and a busy one with fewer.

The simulations drive a Governor with a clock and a count of finished entries that
the test makes from a model of the rate at each slot count; no server (the real
workers' tests are tests/integration/test_governor.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from streamq.base.config import MAX_AUTO_BATCH, MAX_AUTO_PREFETCH, SLOW_ENTRY_S
from streamq.base.governor import (
    FIRST_TRIAL_S,
    MAX_WINDOW_S,
    WINDOW_S,
    Governor,
    next_claim,
    next_read,
)


class Model:
    """A worker's finished count under ``rate(active, t)`` entries/s, a clock that the
    test moves in rounds of ``step`` s, and the governor it drives."""

    def __init__(self, most: int, rate: Callable[[int, float], float],
                 step: float = 0.05) -> None:
        self.t, self.n, self.step, self.rate = 0.0, 0.0, step, rate
        self.gov = Governor(most, lambda: int(self.n), clock=lambda: self.t)
        self.gov.restart()
        self.seen: list[int] = []

    def run(self, seconds: float, empty: Callable[[float], bool] = lambda t: False) -> None:
        end = self.t + seconds
        while self.t < end:
            self.t += self.step
            self.n += self.rate(self.gov.active, self.t) * self.step
            if empty(self.t):
                self.gov.emptied()
            self.gov.tick()
            self.seen.append(self.gov.active)


def test_a_waiting_handler_gets_every_slot() -> None:
    # Given a handler that waits (each slot serves 100/s, as with a 10 ms sleep)
    m = Model(4, lambda k, t: 100.0 * k)
    # When it serves for a while: it starts with one slot, then climbs to all four
    m.run(FIRST_TRIAL_S - 0.1)
    assert set(m.seen) == {1}
    m.run(30)
    assert m.gov.active == 4
    # Then it stays there (a trial of one fewer is refused)
    m.seen.clear()
    m.run(120)
    assert m.seen.count(4) / len(m.seen) > 0.9


def test_a_busy_handler_keeps_one_slot_and_trials_grow_rare() -> None:
    # Given a handler whose second thread only adds lock hand-offs (a CPU-bound host)
    m = Model(4, lambda k, t: 6000.0 if k == 1 else 5000.0 - 300 * k)
    # When it serves for two minutes
    m.run(120)
    # Then it is back at one slot, and spent most of the time there: each refused
    # trial doubles the wait before the next
    assert m.gov.active == 1
    assert m.seen.count(1) / len(m.seen) > 0.9, m.seen.count(1) / len(m.seen)


def test_a_load_change_during_a_trial_is_not_taken_for_the_slots_doing() -> None:
    # Given a busy handler (one slot is best) whose rate jumps by 60% at t = 2.9 s,
    # in the middle of the first trial (as when a submitter that shared the CPU stops)
    def rate(k: int, t: float) -> float:
        return (1.6 if t > 2.9 else 1.0) * (4000.0 if k == 1 else 3500.0)

    m = Model(4, rate)
    # When the trial ends (A 0.4-2.0 s, B 2.4-3.2 s, A' 3.6-4.4 s)
    m.run(5)
    # Then two slots were not kept (the rate with one slot measured again after the
    # trial shows the jump was not theirs)
    assert m.gov.active == 1
    assert 2 in m.seen


def test_a_queue_run_dry_measures_nothing() -> None:
    # Given a waiting handler whose slots find the queue empty every round
    m = Model(4, lambda k, t: 100.0 * k)
    # When it serves: nothing measured, nothing moves
    m.run(30, empty=lambda t: True)
    assert set(m.seen) == {1}


def test_slow_handlers_that_finish_nothing_in_a_window_get_another_slot_at_once() -> None:
    # Given handlers so slow that no entry finishes in a window (every slot is busy)
    m = Model(4, lambda k, t: 0.0)
    # When the windows pass: one slot more per window, up to the most
    m.run(FIRST_TRIAL_S + 5 * MAX_WINDOW_S)
    assert m.gov.active == 4


def test_a_governor_of_one_slot_never_moves() -> None:
    m = Model(1, lambda k, t: 100.0 * k)
    m.run(60)
    assert set(m.seen) == {1}


def test_a_slot_that_does_not_serve_waits_until_it_does_or_the_worker_stops() -> None:
    gov = Governor(4, lambda: 0)
    stop = threading.Event()
    assert gov.serves(0) and not gov.serves(2)
    t0 = time.monotonic()
    gov.wait(2, stop, timeout=0.2)
    assert time.monotonic() - t0 >= 0.15  # waited, since slot 2 does not serve
    stop.set()
    t0 = time.monotonic()
    gov.wait(2, stop, timeout=5)
    assert time.monotonic() - t0 < 1  # a stopping worker does not wait
    assert WINDOW_S < MAX_WINDOW_S


def test_the_next_slot_serves_when_every_serving_slot_is_held_by_a_slow_handler() -> None:
    # Given a governor of 4 slots, one serving, its clock moved by the test, and the
    # serving slot's thread inside a handler that started at 0
    now = [0.0]
    gov = Governor(4, lambda: 0, clock=lambda: now[0])
    stop, inside, release = threading.Event(), threading.Event(), threading.Event()

    def handler(p: Any) -> Any:
        inside.set()
        release.wait(30)
        return p

    held = threading.Thread(target=gov.timed(handler), args=(1,))
    held.start()
    assert inside.wait(30)
    # When the next slot in line waits while the handler has run less than SLOW_ENTRY_S
    now[0] = SLOW_ENTRY_S / 2
    gov.wait(1, stop)
    # Then it does not serve yet
    assert gov.active == 1 and not gov.serves(1)
    # When it waits again once the handler has run SLOW_ENTRY_S
    now[0] = SLOW_ENTRY_S
    gov.wait(1, stop)
    # Then every slot serves (and claims what waits), without waiting for a window
    assert gov.active == 4 and gov.serves(1) and gov.serves(3)
    release.set()
    held.join(30)


def test_a_handler_that_returned_holds_no_slot() -> None:
    # Given a governor of 4 slots, one serving, whose handler ran and returned
    now = [0.0]
    gov = Governor(4, lambda: 0, clock=lambda: now[0])
    assert gov.timed(lambda p: p)(1) == 1
    # When the next slot in line waits long after that handler started
    now[0] = 60.0
    gov.wait(1, threading.Event())
    # Then it does not serve: the serving slot is between handlers, not held
    assert gov.active == 1


def test_a_slow_round_shrinks_the_claim_and_a_quick_full_one_grows_it() -> None:
    # Given a slot with the default (adapting) prefetch, claiming 8
    # When a claim got all 8 but its round took 0.4 s (50 ms handlers)
    # Then the next claim is smaller: slow handlers hold few leases, so a more urgent
    # job arriving is claimed soon by this or another slot
    assert next_claim(8, 8, False, 0.4) == 4
    # And a claim that got all it asked in a quick round doubles, up to the most
    assert next_claim(8, 8, False, 0.01) == 16
    assert next_claim(MAX_AUTO_PREFETCH, MAX_AUTO_PREFETCH, False, 0.01) == MAX_AUTO_PREFETCH
    # And a claim in between keeps its size, as does one that got fewer than it asked
    assert next_claim(8, 8, False, 0.07) == 8
    assert next_claim(8, 3, False, 0.01) == 8
    # And a round that read a full batch of one job (a big job) claims one token next
    assert next_claim(8, 8, True, 0.01) == 1


def test_full_reads_in_quick_rounds_grow_the_batch_and_slow_rounds_shrink_it() -> None:
    assert next_read(10, 1, 0.01, True) == 20
    assert next_read(MAX_AUTO_BATCH, 1, 0.01, True) == MAX_AUTO_BATCH
    assert next_read(10, 1, 0.01, False) == 10  # reads not full: keeps its size
    assert next_read(10, 1, 0.4, True) == 5
    assert next_read(1, 1, 0.4, False) == 1
    assert next_read(8, 8, 0.4, False) == 8  # an async slot keeps its share
