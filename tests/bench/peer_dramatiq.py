"""Dramatiq's side of tests/bench/bench_peers.py: one actor doing the job body every
row does (one INCR), on the bench's redis-server (``BENCH_REDIS_URL``)."""

from __future__ import annotations

import os

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

URL = os.environ["BENCH_REDIS_URL"]
dramatiq.set_broker(RedisBroker(url=URL))
_r: redis.Redis | None = None


@dramatiq.actor(queue_name="bench", max_retries=0)
def incr(n: int) -> None:
    global _r
    if _r is None:
        _r = redis.Redis.from_url(URL)
    _r.incr("bench:incr")
