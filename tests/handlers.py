"""Handlers for worker subprocesses started by the tests."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from streamq import current_task


def echo(payload: Any) -> Any:
    return payload


def slow(payload: Any) -> Any:
    """Mark the start in Redis (key ``started:<job>:<index>``), sleep, return."""
    task = current_task()
    assert task is not None
    r = redis.Redis.from_url(os.environ["STREAMQ_REDIS_URL"])
    r.set(f"started:{task.job_id}:{task.index}", 1)
    time.sleep(float(payload["sleep"]))
    r.set(f"finished:{task.job_id}:{task.index}", 1)
    return {"slept": payload["sleep"]}
