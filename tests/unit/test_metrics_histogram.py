"""The worker's batch histograms count each value in its Prometheus bucket."""

from __future__ import annotations

import random
from bisect import bisect_left

from prometheus_client import CollectorRegistry

from streamq.base.metrics import BUCKETS, BatchHistogram


def test_a_batch_is_counted_as_values_one_by_one_would_be() -> None:
    # Given values on every bound, between bounds, below the first and above the last
    rng = random.Random(7)
    values = [*BUCKETS, 0.0, 1e-9, 400.0, *(rng.uniform(0, 350) for _ in range(500)),
              *(rng.expovariate(200) for _ in range(500))]
    h = BatchHistogram("t_seconds", "doc", "queue", "q", BUCKETS, CollectorRegistry())
    # When they are observed in batches of every size, in random order
    rng.shuffle(values)
    at = 0
    for size in (1, 0, 7, 100, 1000):
        h.observe_many(values[at : at + size])
        at += size
    h.observe_many(iter(values[at:]))  # any iterable
    # Then each bucket holds the values a one-by-one count puts there (a value equal to
    # a bound counts in that bound's bucket), and the sum is theirs
    expected = [0] * (len(BUCKETS) + 1)
    for v in values:
        expected[bisect_left(BUCKETS, v)] += 1
    assert h.counts == expected
    assert abs(h.sum - sum(values)) < 1e-6
    family = next(iter(h.collect()))
    buckets = [s for s in family.samples if s.name.endswith("_bucket")]
    assert buckets[-1].value == len(values)
