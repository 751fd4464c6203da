"""A worker's activity counts and the percentiles read from them, without a server
(tests/integration/test_history.py has what the heartbeats make of them in Redis)."""

from __future__ import annotations

import threading

from streamq.services.history import ActivityCounter, percentile


def test_the_counter_sums_every_thread_and_keeps_a_batch_until_it_is_sent() -> None:
    # Given counts from 8 threads at once
    c = ActivityCounter()

    def count() -> None:
        for _ in range(1000):
            c.started([0.004, 2.5])
            c.finished(1)
        c.failed()

    threads = [threading.Thread(target=count) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then the batch holds them all, bucketed
    batch = c.batch()
    assert batch is not None
    ident, pairs = batch
    assert dict(pairs) == {"started": 16_000, "finished": 8000, "failed": 8,
                           "w5": 8000, "w3000": 8000}
    # and stays the same batch, even with more counted, until it is sent
    c.finished(5)
    assert c.batch() == (ident, pairs)
    c.sent()
    nxt = c.batch()
    assert nxt is not None and nxt[0] != ident and dict(nxt[1]) == {"finished": 5}
    c.sent()
    assert c.batch() is None and not c.unsent()
    # and longer waits than the last bound go in the overflow bucket
    c.started([10_000.0])
    batch = c.batch()
    assert batch is not None and dict(batch[1]) == {"started": 1, "winf": 1}


def test_percentiles_interpolate_inside_their_bucket() -> None:
    assert percentile([], 0.5) is None
    assert percentile([(10.0, 0)], 0.5) is None
    # 10 in (0, 10], 10 in (10, 20]: the median is 10, p95 19
    hist = [(10.0, 10), (20.0, 10)]
    assert percentile(hist, 0.5) == 10.0
    assert percentile(hist, 0.95) == 19.0
    # the overflow bucket gives its lower bound
    assert percentile([(5.0, 1), (float("inf"), 9)], 0.99) == 5.0
