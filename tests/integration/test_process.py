"""Worker processes: SIGTERM drains; the command line gives clear errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from streamq import JobState, Queue
from streamq.base.keys import JobKeys, QueueKeys

ROOT = Path(__file__).resolve().parents[2]


def spawn_worker(url: str, queue: str, handler: str, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, STREAMQ_REDIS_URL=url, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "streamq", "worker", queue, "--handler", handler, *args],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_sigterm_lets_the_current_sub_request_finish(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a worker process busy with the first of three slow sub-requests
    q = Queue(queue_name, redis_url)
    job = q.submit([{"sleep": 1.5}] * 3, concurrency=1)
    proc = spawn_worker(redis_url, queue_name, "tests.handlers:slow", "--concurrency", "1",
                        "--batch", "3", "--log-level", "WARNING")
    try:
        deadline = time.monotonic() + 20
        while not r.exists(f"started:{job.id}:0"):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        # When it gets SIGTERM
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # Then the running sub-request finished and was acknowledged with its result
    assert r.exists(f"finished:{job.id}:0")
    st = q.status(job.id)
    assert (st.done, st.in_flight, st.queued) == (1, 0, 2)
    assert q.results(job.id) == {0: {"slept": 1.5}}
    # the two it had read but not started went back to the stream, never started
    assert not r.exists(f"started:{job.id}:1") and not r.exists(f"started:{job.id}:2")
    assert r.xlen(JobKeys(job.id, queue_name).tasks) == 2
    # its token is back in ready and it left the worker registry
    qk = QueueKeys(queue_name)
    assert r.zcard(qk.leased) == 0 and r.zcard(qk.ready) == 1 and r.zcard(qk.workers) == 0
    # and another worker finishes the job
    proc2 = spawn_worker(redis_url, queue_name, "tests.handlers:slow", "--log-level", "WARNING")
    try:
        assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    finally:
        proc2.send_signal(signal.SIGTERM)
        proc2.communicate(timeout=20)
        assert proc2.returncode == 0
    assert q.results(job.id) == {i: {"slept": 1.5} for i in range(3)}


def test_cli_help_and_bad_handler(redis_url: str) -> None:
    out = subprocess.run([sys.executable, "-m", "streamq", "--help"], capture_output=True,
                         text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and "worker" in out.stdout
    bad = spawn_worker(redis_url, "q", "no_such_module:fn")
    _, err = bad.communicate(timeout=60)
    assert bad.returncode == 2
    assert err.decode().strip().splitlines() == [
        "streamq: cannot import module 'no_such_module': no module named 'no_such_module' "
        f"in {ROOT} or on the Python path"]
    bad = spawn_worker("redis://127.0.0.1:1/0", "q", "tests.handlers:echo", "--redis-wait", "0.5")
    _, err = bad.communicate(timeout=60)
    assert bad.returncode == 3
    assert "Traceback" not in err.decode() and "cannot reach Redis" in err.decode()
