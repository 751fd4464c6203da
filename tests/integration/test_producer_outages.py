"""A queue client waits out Redis refusing work for a while (a long script: BUSY): a
submit on either lane and a status read go through once the spell ends, each job
made once; a spell longer than it waits (config.PRODUCER_OUTLAST_S) gives a clear
ConnectionFailed, not Redis's raw reply."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import start_redis, wait_until

from streamq import ConnectionFailed, Queue
from streamq.base import config

#: a script that keeps Redis busy for ARGV[1] ms (by Redis's clock)
SPIN = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start >= ARGV[1] * 1000
return 1
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    # (a script running past 100 ms makes Redis answer BUSY)
    proc, url = start_redis(tmp_path, "--busy-reply-threshold", "100")
    yield url
    proc.kill()
    proc.wait()


def busy(url: str, ms: int) -> threading.Thread:
    """Keep Redis busy ``ms`` from now; returns once other clients get BUSY."""
    spinner = threading.Thread(target=lambda: redis.Redis.from_url(url).eval(SPIN, 0, ms),
                               daemon=True)
    spinner.start()
    probe = redis.Redis.from_url(url)

    def refused() -> bool:
        try:
            probe.get("x")
        except redis.ResponseError as e:
            return str(e).startswith("BUSY")
        return False

    wait_until(refused, 10, "Redis to answer BUSY")
    return spinner


def test_a_submit_and_a_read_outlast_a_busy_redis(server: str) -> None:
    q = Queue("busy", server)
    known = q.submit([0]).id  # (the queue's first use: its configuration stored)
    # Given Redis busy with a long script for 1.5 s
    spinner = busy(server, 1_500)
    # When a small job and a job on its own stream are submitted, and a status read
    small = q.submit([{"n": 1}])
    own = q.submit([{"n": 2}], job_id="own-job")
    st = q.status(known)
    spinner.join()
    # Then each went through once the spell ended, and each job was made once
    assert small.created and own.created and st.total == 1
    assert sorted(q.unfinished()) == sorted([known, small.id, "own-job"])
    assert q.status(small.id).total == 1 and q.status("own-job").total == 1
    q.close()


def test_a_spell_longer_than_a_client_waits_is_a_clear_error(
        server: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(config, "PRODUCER_OUTLAST_S", 0.3)
    q = Queue("busy", server)
    q.submit([0])
    # Given Redis busy for longer than the client waits
    spinner = busy(server, 2_500)
    t0 = time.monotonic()
    # When a submit and a status read are made, each raises ConnectionFailed naming why
    with pytest.raises(ConnectionFailed, match="cannot serve for now: BUSY"):
        Queue("busy", server).submit([{"n": 1}])
    with pytest.raises(ConnectionFailed, match="cannot serve for now: BUSY"):
        q.status("anything")
    assert time.monotonic() - t0 < 2.5  # (both gave up while Redis was still busy)
    spinner.join()
    q.close()


def test_a_reaper_still_sees_a_refusing_redis_as_transient(server: str) -> None:
    # Given a repeat due and a reaper (whose loops wait a refusing Redis out themselves)
    from streamq.reaping.reaper import Reaper
    from streamq.storage.connection import is_transient

    q = Queue("busy", server)
    q.repeats.add("beat", [{"n": 1}], every=1)
    r = redis.Redis.from_url(server)
    due = r.zrange(q.keys.repeat_next, 0, 0, withscores=True)[0][1]
    time.sleep(max(0.0, due / 1000 - time.time()) + 0.1)
    reaper = Reaper("busy", server)
    # When Redis refuses the tick's submit for a while (out of memory: reads still served)
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", "1")
    try:
        with pytest.raises(Exception) as caught:
            reaper.tick_repeats()
    finally:
        r.config_set("maxmemory", "0")
    # Then what it raises is one its loops wait out (a pass cut short, logged quietly),
    # not an unexpected failure
    assert is_transient(caught.value), repr(caught.value)
    reaper.q.close()
    q.close()
