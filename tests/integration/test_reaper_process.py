"""`streamq reaper` as a process against a Redis that is absent, refuses it, or
cannot serve for a while (OOM, BUSY): it waits, logs one line, and goes on; only
refused access, or an absence longer than --redis-wait, stops it (exit 3, one line)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from conftest import ROOT, free_port, module_args, start_redis

from streamq import ConnectionFailed, Queue
from streamq.storage import functions

Launch = Callable[..., subprocess.Popen[bytes]]


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def reaper(tmp_path: Path) -> Iterator[Launch]:
    """Start ``python -m streamq reaper`` processes, stderr to ``tmp_path/<n>.log``;
    every one still running is killed at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def launch(url: str, queue: str, *args: str) -> subprocess.Popen[bytes]:
        log = tmp_path / f"reaper-{len(started)}.log"
        env = dict(os.environ, PYTHONPATH=str(ROOT), STREAMQ_REDIS_URL=url)
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "streamq", "reaper", queue, "--interval", "0.5",
                 "--min-idle", "1", "--log-level", "WARNING", *args],
                env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        proc.log = log  # type: ignore[attr-defined]
        started.append(proc)
        return proc

    yield launch
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def stderr_of(proc: subprocess.Popen[bytes]) -> str:
    return Path(proc.log).read_text()  # type: ignore[attr-defined]


def stop(proc: subprocess.Popen[bytes]) -> str:
    """SIGTERM; assert a clean exit; return what it logged."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, stderr_of(proc)
    err = stderr_of(proc)
    assert "Traceback" not in err, err
    return err


def stalled_job(url: str, queue: str) -> Callable[[], bool]:
    """A job whose 3 entries a vanished consumer read; returns "the reaper took them back"."""
    q = Queue(queue, url)
    jk = q.keys.job(q.submit([1, 2, 3]).id)
    q.redis.xreadgroup("workers", "vanished", {jk.tasks: ">"}, count=3)
    return lambda: int(q.redis.xpending(jk.tasks, "workers")["pending"]) == 0


def test_reaper_started_before_redis_waits_for_it_then_works(
    tmp_path: Path, queue_name: str, reaper: Launch
) -> None:
    # Given a reaper started while nothing listens on its Redis port
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = reaper(url, queue_name)
    wait_until(lambda: stderr_of(proc).count("waiting for Redis") >= 2, 60, "two attempts")
    assert proc.poll() is None
    # When redis-server starts on that port
    server, _ = start_redis(tmp_path, port=port)
    try:
        reclaimed = stalled_job(url, queue_name)
        # Then the reaper does its work: the stalled entries are taken back
        wait_until(reclaimed, 60, "the stalled entries to be reclaimed")
        assert proc.poll() is None
        err = stop(proc)
        # having logged one line per failed attempt while it waited
        assert all("waiting for Redis (attempt" in line or "reachable again" in line
                   for line in err.strip().splitlines()), err
    finally:
        server.terminate()
        server.wait(10)


def test_reaper_gives_up_after_redis_wait_with_one_line(queue_name: str, reaper: Launch) -> None:
    # Given no Redis, and a reaper told to wait 1 s for it
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = reaper(url, queue_name, "--redis-wait", "1", "--log-level", "ERROR")
    # Then it exits 3 with one line, no traceback
    assert proc.wait(60) == 3
    lines = stderr_of(proc).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamq: cannot reach Redis"), lines


def test_reaper_gives_up_when_redis_stays_away_longer_than_redis_wait(
    tmp_path: Path, queue_name: str, reaper: Launch
) -> None:
    # Given a reaper with --redis-wait 2 doing passes on a Redis that then goes away
    server, url = start_redis(tmp_path)
    try:
        proc = reaper(url, queue_name, "--redis-wait", "2")
        reclaimed = stalled_job(url, queue_name)
        wait_until(reclaimed, 60, "a first pass")
    finally:
        server.kill()
        server.wait(10)
    # Then it exits 3, its last line saying why, with no traceback
    assert proc.wait(60) == 3
    err = stderr_of(proc)
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("streamq: cannot reach Redis after"), err


@pytest.mark.parametrize("command", ["sq.fcall|sq_lock", "time"])
def test_reaper_refused_a_command_exits_3_with_one_line(
    tmp_path: Path, queue_name: str, reaper: Launch, command: str
) -> None:
    # Given a Redis whose reaper user lacks a command the reaper needs (its lock
    # function, called through the module; `time`, sent by the reaper itself)
    lines = []
    from streamq.ops.roles import acl_line

    shipped = ["user default off", *(acl_line(r, f"{r}-secret") for r in
                                     ("producer", "worker", "reaper", "inspector", "admin"))]
    for line in shipped:
        if line.startswith("user reaper "):
            assert f" +{command}" in line
            line = line.replace(f" +{command}", "")
        lines.append(line)
    (tmp_path / "users.acl").write_text("\n".join(lines) + "\n")
    server, url = start_redis(tmp_path, *module_args(), "--aclfile", str(tmp_path / "users.acl"),
                              ping=False)
    try:
        host = url.removeprefix("redis://")
        admin = redis.Redis.from_url(f"redis://admin:admin-secret@{host}")
        wait_until(admin.ping, 30, "redis-server with the ACL file")
        functions.load(admin)  # what `streamq setup` does as the admin
        admin.close()
        proc = reaper(f"redis://reaper:reaper-secret@{host}", queue_name)
        # Then it stops at its first pass: exit 3, one line, no traceback
        assert proc.wait(60) == 3
        out = stderr_of(proc).strip().splitlines()
        assert len(out) == 1 and out[0].startswith("streamq: Redis refused access"), out
    finally:
        server.terminate()
        server.wait(10)


def test_reaper_survives_oom(tmp_path: Path, queue_name: str, reaper: Launch) -> None:
    # Given a reaper doing passes on a Redis holding data
    server, url = start_redis(tmp_path)
    r = redis.Redis.from_url(url)
    try:
        proc = reaper(url, queue_name)
        wait_until(stalled_job(url, queue_name), 60, "a first pass")
        reclaimed = stalled_job(url, queue_name)
        # When Redis runs out of memory for a while
        r.config_set("maxmemory", 1)
        refused = Queue(queue_name, url)
        refused.scripts.outlast_s = 0  # (said at once: a queue client waits it out)
        with pytest.raises(ConnectionFailed, match="used memory"):
            refused.submit([1])  # (new work is refused)
        # Then the reaper goes on with its work: recovery runs while Redis is full (its
        # functions, its lock's included, may run under OOM: they are how Redis drains)
        wait_until(reclaimed, 60, "the stalled entries to be reclaimed under OOM")
        assert proc.poll() is None
        r.config_set("maxmemory", 0)
        wait_until(stalled_job(url, queue_name), 60, "the stalled entries to be reclaimed")
        err = stop(proc)
        assert "Traceback" not in err, err
    finally:
        r.close()
        server.terminate()
        server.wait(10)


def test_reaper_survives_a_busy_script(tmp_path: Path, queue_name: str, reaper: Launch) -> None:
    # Given a reaper doing passes
    server, url = start_redis(tmp_path, "--busy-reply-threshold", "100")
    r = redis.Redis.from_url(url)
    try:
        proc = reaper(url, queue_name)
        wait_until(stalled_job(url, queue_name), 60, "a first pass")
        # When another client runs a script that does not end
        def endless() -> None:
            with pytest.raises(redis.ResponseError):
                redis.Redis.from_url(url).eval("while true do end", 0)

        t = threading.Thread(target=endless, daemon=True)
        t.start()
        wait_until(lambda: stderr_of(proc).count("BUSY") >= 2, 60, "BUSY logged twice")
        assert proc.poll() is None
        # and is then killed
        wait_until(lambda: _script_kill(r), 30, "SCRIPT KILL")
        t.join(30)
        # Then the reaper goes on with its work
        wait_until(stalled_job(url, queue_name), 60, "the stalled entries to be reclaimed")
        stop(proc)
    finally:
        r.close()
        server.terminate()
        server.wait(10)


def _script_kill(r: redis.Redis) -> bool:
    try:
        r.script_kill()
        return True
    except redis.ResponseError:  # NOTBUSY: the script has not started yet
        return False
