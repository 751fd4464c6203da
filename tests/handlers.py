"""Handlers for worker subprocesses started by the tests.

They record every start in the test's Redis (``STREAMQ_REDIS_URL``) so a test
can count how often each sub-request ran, across processes and kills.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from streamq import current_task
from streamq.storage.connection import Client, connect

_client: Client | None = None


def _redis() -> Client:
    global _client
    if _client is None:  # a RedisCluster when the test server is a cluster
        _client = connect(os.environ["STREAMQ_REDIS_URL"])
    return _client


def _start() -> str:
    task = current_task()
    assert task is not None
    key = f"{task.job_id}:{task.index}"
    _redis().incr(f"starts:{key}")
    return key


def echo(payload: Any) -> Any:
    return payload


def slow(payload: Any) -> Any:
    """Mark the start in Redis (key ``started:<job>:<index>``), sleep, return."""
    task = current_task()
    assert task is not None
    r = _redis()
    r.set(f"started:{task.job_id}:{task.index}", 1)
    time.sleep(float(payload["sleep"]))
    r.set(f"finished:{task.job_id}:{task.index}", 1)
    return {"slept": payload["sleep"]}


def count(payload: Any) -> Any:
    """Count the start, sleep ``payload["sleep"]`` seconds, return ``n * 2``."""
    _start()
    time.sleep(float(payload.get("sleep", 0)))
    return payload["n"] * 2


def poison(payload: Any) -> Any:
    """Count the start; a payload with ``"kill": true`` kills its own process."""
    _start()
    if payload.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(payload.get("sleep", 0)))
    return payload["n"] * 2


def fail_once(payload: Any) -> Any:
    """Count the start; fail the first attempt of each sub-request with
    ``RetryLater(payload["delay"])``; return ``payload["n"] * 2`` from the second on."""
    from streamq import RetryLater

    _start()
    task = current_task()
    assert task is not None
    if task.attempt == 1:
        raise RetryLater(float(payload["delay"]))
    return payload["n"] * 2


def count_or_fail(payload: Any) -> Any:
    """Count the start; a payload with ``"bad": true`` raises, others return ``n * 2``."""
    _start()
    if payload.get("bad"):
        raise ValueError(f"bad sub-request {payload['n']}")
    return payload["n"] * 2


def fail_then_kill(payload: Any) -> Any:
    """Count the start; the first attempt raises; each later attempt number kills its
    own process the first time it is seen and raises on any later run of it."""
    key = _start()
    task = current_task()
    assert task is not None
    if task.attempt >= 2 and _redis().set(f"killed:{key}:{task.attempt}", 1, nx=True):
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"attempt {task.attempt} fails")


async def acount(payload: Any) -> Any:
    """``count`` as an ``async def`` handler: the start counted, an asyncio sleep."""
    import asyncio

    _start()
    await asyncio.sleep(float(payload.get("sleep", 0)))
    return payload["n"] * 2


def nap(payload: Any) -> Any:
    """Sleep ``payload["sleep"]`` seconds without touching Redis; return ``payload["n"]``."""
    time.sleep(float(payload.get("sleep", 0)))
    return payload["n"]


def hang(payload: Any) -> Any:
    """Sleep a minute without touching Redis (a worker to kill while it holds work)."""
    time.sleep(60)
    return payload


def echo_or_refuse(payload: Any) -> Any:
    """Return the payload; the payload ``"poison"`` fails for good, ``"again"`` asks for
    a retry on its first attempt."""
    from streamq import NonRetryable, RetryLater

    if payload == "poison":
        raise NonRetryable("poison")
    task = current_task()
    if payload == "again" and task is not None and task.attempt <= 1:
        raise RetryLater(0.2)
    return payload


def until_cancelled(payload: Any) -> Any:
    """Count the start, then run up to ``payload["max"]`` seconds, stopping early once
    the job is seen cancelled; return whether it was (``{"n": n, "cancelled": ...}``)."""
    _start()
    task = current_task()
    assert task is not None
    until = time.monotonic() + float(payload.get("max", 20))
    while time.monotonic() < until and not task.cancelled:
        time.sleep(0.02)
    return {"n": payload["n"], "cancelled": task.cancelled,
            "ran": round(time.monotonic() - until + float(payload.get("max", 20)), 2)}


def stamp(payload: Any) -> Any:
    """Count the start and note it, with Redis's clock (ms), in the list
    ``stamps:<payload["tag"]>`` (``<ms>|<job>:<index>``); sleep ``payload["sleep"]``
    seconds; return ``payload["n"]``."""
    from streamq.storage.connection import server_ms

    key = _start()
    r = _redis()
    stamps = f"stamps:{payload['tag']}"
    r.rpush(stamps, f"{server_ms(r, stamps)}|{key}")
    time.sleep(float(payload.get("sleep", 0)))
    return payload["n"]


def stall(payload: Any) -> Any:
    """Count the start and note its attempt (list ``attempts:<job>:<index>``) and its
    deadline (``deadline:<job>:<index>``); hang ``payload["hang"]`` seconds on the first
    start (on every one with ``"always": true``), then note the late return
    (``late:<job>:<index>``); return ``{"n": n * 2, "attempt": attempt}``."""
    task = current_task()
    assert task is not None
    key = f"{task.job_id}:{task.index}"
    r = _redis()
    first = r.incr(f"starts:{key}") == 1
    r.rpush(f"attempts:{key}", task.attempt)
    if task.deadline is not None:
        r.set(f"deadline:{key}", repr(task.deadline))
    if payload.get("hang") and (payload.get("always") or first):
        time.sleep(float(payload["hang"]))
        r.set(f"late:{key}", 1)
        return {"late": True}
    return {"n": payload["n"] * 2, "attempt": task.attempt}


async def astall(payload: Any) -> Any:
    """``stall`` as an ``async def`` handler: the hang an asyncio sleep, its cancellation
    noted (``cancelled:<job>:<index>``)."""
    import asyncio

    key = _start()
    task = current_task()
    assert task is not None
    r = _redis()
    r.rpush(f"attempts:{key}", task.attempt)
    if payload.get("hang") and (payload.get("always") or task.attempt == 1):
        try:
            await asyncio.sleep(float(payload["hang"]))
        except asyncio.CancelledError:
            r.set(f"cancelled:{key}", 1)
            raise
        r.set(f"late:{key}", 1)
        return {"late": True}
    return {"n": payload["n"] * 2, "attempt": task.attempt}


def refuse_while_flagged(payload: Any) -> Any:
    """Fail for good (NonRetryable) while the key ``refuse:<payload["tag"]>`` exists;
    else return ``{"n": n, "ok": true}``."""
    from streamq import NonRetryable

    _start()
    if _redis().exists(f"refuse:{payload['tag']}"):
        raise NonRetryable(f"refused {payload['n']}")
    return {"n": payload["n"], "ok": True}


def span(payload: Any) -> Any:
    """Record the start and the end of each run in Redis's list ``spans:<tag>`` (in
    the order Redis received them: no clock), as ``+job:index@pid`` and
    ``-job:index@pid``, sleeping ``payload["sleep"]`` between (after the key
    ``payload["gate"]`` exists, when given)."""
    task = current_task()
    assert task is not None
    r, key, run = _redis(), f"spans:{payload['tag']}", f"{task.job_id}:{task.index}@{os.getpid()}"
    r.rpush(key, f"+{run}")
    while payload.get("gate") and not r.exists(payload["gate"]):
        time.sleep(0.01)
    time.sleep(float(payload["sleep"]))
    r.rpush(key, f"-{run}")
    return payload["n"]


def stall_first(payload: Any) -> Any:
    """Count the start; the first ``payload["stalls"]`` (default 1) starts of a
    sub-request set ``started:<job>:<index>`` to their number and sleep a minute (a
    worker to kill by its pid while it runs); a later start returns ``n * 2`` and the
    attempt number it was given."""
    key = _start()
    n = int(_redis().get(f"starts:{key}") or 0)
    if n <= int(payload.get("stalls", 1)):
        _redis().set(f"started:{key}", n)
        time.sleep(60)
    task = current_task()
    assert task is not None
    return {"n": payload["n"] * 2, "attempt": task.attempt}
