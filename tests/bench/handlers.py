"""Handlers for the benchmark's worker subprocesses."""

from __future__ import annotations

import os
from typing import Any

import redis
import redis.asyncio

#: the key the INCR handlers increment (tests/bench/bench_small.py counts it)
COUNTER = "bench:incr"
_sync: redis.Redis | None = None
_async: redis.asyncio.Redis | None = None


def echo(payload: Any) -> Any:
    """Return the payload: the cheapest handler, so the queue itself is measured."""
    return payload


def incr(payload: Any) -> Any:
    """One INCR on the benchmark's server: the smallest job body with a round trip."""
    global _sync
    if _sync is None:
        _sync = redis.Redis.from_url(os.environ["STREAMQ_REDIS_URL"])
    return _sync.incr(COUNTER)


async def aincr(payload: Any) -> Any:
    """The same INCR from an ``async def`` handler (redis.asyncio)."""
    global _async
    if _async is None:  # made on the worker's event loop, and used only there
        _async = redis.asyncio.Redis.from_url(os.environ["STREAMQ_REDIS_URL"])
    return await _async.incr(COUNTER)


def nap(payload: Any) -> Any:
    """Sleep ``payload["sleep"]`` seconds (a handler that waits on something else); a
    payload with ``"mark"`` first records its start by Redis's clock in that key."""
    global _sync
    if payload.get("mark"):
        if _sync is None:
            _sync = redis.Redis.from_url(os.environ["STREAMQ_REDIS_URL"])
        sec, usec = _sync.time()
        _sync.set(payload["mark"], sec * 1000 + usec / 1000)
    import time

    time.sleep(float(payload["sleep"]))
    return payload.get("n")
