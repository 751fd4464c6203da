"""Commands that follow jobs (`submit --wait`, `subscribe`) outlast a Redis restart:
Redis is SIGKILLed and started again on its port with its data, and the command goes
on following, to the job's end and exit 0, instead of exit 3; a subscriber cut off
for a while prints the completions recorded meanwhile."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import free_port, start_redis, subscribers, wait_until

from streamq import Queue
from streamq.base.keys import QueueKeys

ROOT = Path(__file__).resolve().parents[2]
#: an append-only file written at every change: a restart finds every job again
DURABLE = ("--appendonly", "yes", "--appendfsync", "always")


class Restartable:
    """A redis-server of this test, killed and started again on its port and dir."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.port = workdir, free_port()
        self.proc, self.url = start_redis(workdir, *DURABLE, port=self.port)

    def restart(self, down_s: float = 3.0) -> None:
        """Kill it, and start it again after ``down_s`` (longer than a client's
        retries of one command)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        time.sleep(down_s)
        self.proc, _ = start_redis(self.workdir, *DURABLE, port=self.port)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Restartable]:
    s = Restartable(tmp_path)
    yield s
    s.stop()


def streamq(url: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, STREAMQ_REDIS_URL=url, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "streamq", *args], text=True, env=env,
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(url: str, queue: str, follower: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Serve ``queue`` with a worker until ``follower`` exits; its code and output."""
    worker = streamq(url, "worker", queue, "--handler", "tests.handlers:echo")
    try:
        out, err = follower.communicate(timeout=60)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.communicate()
    return follower.returncode, out, err


def test_submit_wait_outlasts_a_redis_restart(server: Restartable) -> None:
    r: Any = redis.Redis.from_url(server.url)
    # Given `submit --wait` following its job (no worker yet)
    follower = streamq(server.url, "submit", "outage", '{"n": 1}', "--job-id", "waited",
                       "--wait", "--json")
    wait_until(lambda: subscribers(r, [QueueKeys("outage").job_channel("waited")]) == [1],
               30, "the follower to listen")
    # When Redis is killed and started again with its data
    server.restart()
    # Then, once a worker has run the job, the follower reports it succeeded
    code, out, err = finish(server.url, "outage", follower)
    assert code == 0, err
    assert '"succeeded"' in out and "Traceback" not in err
    # and it was submitted once: one job, of one sub-request
    with Queue("outage", server.url) as q:
        assert q.status("waited").total == 1


def test_subscribe_until_done_outlasts_a_redis_restart(server: Restartable) -> None:
    r: Any = redis.Redis.from_url(server.url)
    # Given a job, and `subscribe --until-done` listening for it
    job = Queue("outage", server.url).submit([{"n": 1}]).id
    follower = streamq(server.url, "subscribe", "outage", job, "--until-done")
    wait_until(lambda: subscribers(r, [QueueKeys("outage").channel]) == [1], 30,
               "the subscriber to listen")
    # When Redis is killed and started again with its data
    server.restart()
    # Then, once a worker has run the job, the subscriber prints it and exits 0
    code, out, err = finish(server.url, "outage", follower)
    assert code == 0, err
    assert f"{job} succeeded" in out and "Traceback" not in err


def test_watch_outlasts_a_busy_redis(tmp_path: Path) -> None:
    # Given `watch` refreshing its dashboard of a queue, on a Redis that answers BUSY
    # to others while a script runs longer than 0.1 s
    proc, url = start_redis(tmp_path, "--busy-reply-threshold", "100")
    r: Any = redis.Redis.from_url(url)
    Queue("outage", url).submit([1])
    watcher = streamq(url, "watch", "outage", "--interval", "0.2")
    try:
        wait_until(lambda: len(r.client_list()) >= 2, 30, "watch to connect")
        # When a script keeps Redis busy for 3 s
        r.eval("local t = tonumber(redis.call('TIME')[1]) + 3 "
               "while tonumber(redis.call('TIME')[1]) < t do end return 1", 0)
        # Then watch still runs once Redis serves again
        assert r.ping() and watcher.poll() is None, watcher.communicate()[1]
    finally:
        watcher.send_signal(signal.SIGKILL)
        watcher.communicate()
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_subscribe_prints_the_completions_recorded_while_it_was_cut_off(
        tmp_path: Path) -> None:
    from proxy import ReplyDropProxy

    proc, url = start_redis(tmp_path)
    r: Any = redis.Redis.from_url(url)
    try:
        with ReplyDropProxy(int(url.rsplit(":", 1)[1].split("/")[0])) as proxy:
            # Given a plain `subscribe` of a queue, through a link that can be cut
            follower = streamq(proxy.url, "subscribe", "cutoff", "--json")
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.extend(follower.stdout or []),
                                      daemon=True)
            reader.start()
            channel = [QueueKeys("cutoff").channel]
            wait_until(lambda: subscribers(r, channel) == [1], 30, "the subscriber")
            # When its link is cut and it cannot subscribe again for a while, during
            # which jobs complete
            proxy.lose_requests_to(b"SUBSCRIBE", 1_000_000)
            proxy.cut_all()
            wait_until(lambda: subscribers(r, channel) == [0], 10, "the link cut")
            with Queue("cutoff", url) as q:
                jobs = [q.submit([{"n": n}]).id for n in range(3)]
                worker = streamq(url, "worker", "cutoff", "--handler", "tests.handlers:echo")
                try:
                    for j in jobs:
                        assert q.wait(j, timeout=30).state.value == "succeeded"
                finally:
                    worker.send_signal(signal.SIGKILL)
                    worker.communicate()
            assert subscribers(r, channel) == [0]
            # Then, once it subscribed again, it prints each of them, from the
            # queue's durable completion records
            proxy.stop_losing()
            wait_until(lambda: len(lines) >= 3, 30, "the completions printed")
            follower.send_signal(signal.SIGKILL)
            follower.communicate()
            assert sorted(json.loads(line)["job_id"] for line in lines) == sorted(jobs)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
