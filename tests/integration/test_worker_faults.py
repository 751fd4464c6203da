"""The worker under faults: leases per slot, resent settles, Redis down at start,
transient Redis states, retries without a reaper, and its health check.

Every scenario runs real processes against a real redis-server: the suite's
own, or a private one that the test puts into the state it needs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import ROOT, Procs, free_port, start_redis, wait_until
from proxy import ReplyDropProxy
from typer.testing import CliRunner

from streamq import ConnectionFailed, JobState, Queue, Worker, current_task
from streamq.base.keys import QueueKeys
from streamq.cli import ExitCode, app
from streamq.model.scripts import Scripts
from streamq.storage.connection import connect, server_ms

StartWorker = Callable[..., Worker]


def start_worker(url: str, queue: str, log: Path, *args: str,
                 handler: str = "tests.handlers:echo") -> subprocess.Popen[bytes]:
    """A real ``python -m streamq worker`` whose log goes to ``log`` (never a full pipe)."""
    env = dict(os.environ, STREAMQ_REDIS_URL=url, PYTHONPATH=str(ROOT))
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "streamq", "worker", queue, "--handler", handler,
             "--heartbeat", "0.2", "--log-level", "WARNING", *args],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out)


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise
    return proc.returncode


# -- leases are owned per slot ----------------------------------------------------------


def test_a_token_moving_between_slots_of_one_worker_keeps_its_lease(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker, procs: Procs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (the job lane: one-entry jobs would ride the small-job lane, without tokens)
    monkeypatch.setenv("STREAMQ_LANE", "0")
    # Given a worker of two slots with short leases, and a reaper returning lapsed ones
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    lock = threading.Lock()
    slots_busy = threading.Semaphore(0)
    j_started_by: list[int] = []
    j_started = threading.Event()

    def handler(p: Any) -> Any:
        task = current_task()
        assert task is not None
        with lock:
            running[task.job_id] += 1
            peak[task.job_id] = max(peak[task.job_id], running[task.job_id])
            if p["tag"] == "J":
                j_started_by.append(threading.get_ident())
                if len(set(j_started_by)) > 1:
                    j_started.set()  # a second slot runs J now
        slots_busy.release()
        time.sleep(p["sleep"])
        with lock:
            running[task.job_id] -= 1
        return p["tag"]

    w = workers(queue_name, handler, concurrency=2, prefetch=1, batch=1, lease_ms=400,
                heartbeat_s=0.1, idle_wait_s=0.05)
    procs.reaper(queue_name, "--interval", "0.2")
    q = Queue(queue_name, redis_url)
    j_token = ""

    # and the interleaving of the defect forced: the slot whose settle released J's
    # token waits, after that settle's reply, until another slot has claimed the
    # token and started J's next sub-request
    def releases_j(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        for a in (*args, *kwargs.values()):
            if isinstance(a, (list, tuple)) and any(
                    isinstance(x, tuple) and len(x) == 2 and x == (j_token, "r") for x in a):
                return True
        return False

    local = threading.local()
    gate_used = threading.Event()
    settle_call, parse_settle = w.scripts.settle_call, w.scripts.parse_settle

    def settle_call_hook(*args: Any, **kwargs: Any) -> Any:
        local.releases_j = bool(j_token) and releases_j(args, kwargs)
        return settle_call(*args, **kwargs)

    def parse_settle_hook(reply: Any) -> Any:
        parsed = parse_settle(reply)
        if getattr(local, "releases_j", False) and not gate_used.is_set():
            gate_used.set()
            j_started.wait(20)
        return parsed

    w.scripts.settle_call = settle_call_hook  # type: ignore[method-assign]
    w.scripts.parse_settle = parse_settle_hook  # type: ignore[method-assign]
    try:
        # When job L (long) and job J (concurrency 1) occupy both slots
        long_job = q.submit([{"tag": "L", "sleep": 2.5}], concurrency=1)
        job = q.submit([{"tag": "J", "sleep": 1.5}] * 3, concurrency=1)
        j_token = f"{job.id}#0"
        assert slots_busy.acquire(timeout=20) and slots_busy.acquire(timeout=20)
        # and a more urgent job K waits, so J's slot takes K when it releases J's token,
        # and the other slot takes J's token once L is done
        urgent = q.submit([{"tag": "K", "sleep": 0.1}], concurrency=1, priority=0)
        # Then every job completes and J never ran two sub-requests at once
        for jb in (long_job, job, urgent):
            assert jb.wait(timeout=60).state is JobState.SUCCEEDED
        assert gate_used.is_set() and j_started.is_set()
        assert peak[job.id] == 1, f"J ran {peak[job.id]} sub-requests at once"
    finally:
        q.close()


# -- settle may be sent twice -----------------------------------------------------------


@pytest.mark.standalone
def test_a_settle_resent_after_a_lost_reply_claims_nothing_more(
    r: redis.Redis, redis_url: str, queue_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (the job lane: one-entry jobs would ride the small-job lane, without tokens)
    monkeypatch.setenv("STREAMQ_LANE", "0")
    # Given two ready jobs, and a client whose connection loses the next reply
    q = Queue(queue_name, redis_url)
    q.submit([1])
    q.submit([2])
    qk = QueueKeys(queue_name)
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with ReplyDropProxy(port) as proxy:
        client = connect(proxy.url)
        scripts = Scripts(client)
        scripts.settle(qk, "w", 0, "warm-up", 60_000, 0)  # scripts loaded, connection open
        # When a settle claiming one token runs, its reply is lost and it is resent
        proxy.drop_next()
        reply = scripts.settle(qk, "w", 0, "call-1", 60_000, 1)
        assert proxy.dropped == 1
        client.close()
    # Then one token is leased, the one the reply names, and the other is still ready
    assert [t for t, _ in reply.claimed] == [m.decode() for m in r.zrange(qk.leased, 0, -1)]
    assert r.zcard(qk.leased) == 1 and r.zcard(qk.ready) == 1
    q.close()


def _a_token_claimed(monkeypatch: pytest.MonkeyPatch, queue_name: str, redis_url: str,
                     lease_ms: int = 60_000) -> tuple[Queue, QueueKeys, Any, str]:
    """A job of one token, claimed by slot 0 of worker "w" with call "a1": the queue,
    its keys, its scripts and the token."""
    # (the job lane: one-entry jobs would ride the small-job lane, without tokens)
    monkeypatch.setenv("STREAMQ_LANE", "0")
    q = Queue(queue_name, redis_url)
    q.submit([1])
    qk, s = QueueKeys(queue_name), q.scripts
    ((tok, _),) = s.settle(qk, "w", 0, "a1", lease_ms, 1).claimed
    return q, qk, s, tok


def test_a_settle_sent_again_never_releases_a_token_claimed_since(
    r: redis.Redis, redis_url: str, queue_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given slot 0 of a worker holding a job's only token
    q, qk, s, tok = _a_token_claimed(monkeypatch, queue_name, redis_url)
    # When slot 0 releases it, slot 1 claims it, and slot 0's release arrives again
    assert s.settle(qk, "w", 0, "a2", 60_000, 0, [(tok, "r")]).claimed == []
    assert [t for t, _ in s.settle(qk, "w", 1, "b1", 60_000, 1).claimed] == [tok]
    again = s.settle(qk, "w", 0, "a2", 60_000, 0, [(tok, "r")])
    # Then the token is still slot 1's: leased, not ready
    assert again.claimed == []
    assert r.hget(qk.owners, tok) == b"w/1"
    assert r.zscore(qk.leased, tok) is not None and r.zscore(qk.ready, tok) is None
    q.close()


def test_a_settle_sent_again_reports_no_token_the_slot_lost_since(
    r: redis.Redis, redis_url: str, queue_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given slot 0 whose claim of a job's only token lost its reply, and the token's
    # lease ran out since: returned to ready by the reaper, then claimed by slot 1
    q, qk, s, tok = _a_token_claimed(monkeypatch, queue_name, redis_url, lease_ms=1)
    time.sleep(0.05)
    wait_until(lambda: s.reap_leases(qk, 60_000, 0)[0] == 1 or r.zscore(qk.ready, tok),
               10, "the lease returned")
    assert [t for t, _ in s.settle(qk, "w", 1, "b1", 60_000, 1).claimed] == [tok]
    # When slot 0 sends its claim again (the same number: it learns what it claimed)
    again = s.settle(qk, "w", 0, "a1", 60_000, 1)
    # Then the token is not reported as slot 0's: it is slot 1's, and only one slot
    # runs its job's entries
    assert again.claimed == []
    assert r.hget(qk.owners, tok) == b"w/1"
    q.close()


# -- Redis down, or refusing for a while ------------------------------------------------


def test_a_worker_started_before_redis_waits_for_it(tmp_path: Path, queue_name: str) -> None:
    # Given a worker started while nothing listens on its Redis port
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    log = tmp_path / "worker.log"
    worker = start_worker(url, queue_name, log)
    server = None
    try:
        wait_until(lambda: log.read_text().count("waiting for Redis") >= 3, 30,
                   "the worker to report waiting")
        assert worker.poll() is None, log.read_text()
        # When the server starts on that port, and a job is submitted afterwards
        server, _ = start_redis(tmp_path, port=port)
        q = Queue(queue_name, url)
        job = q.submit([{"a": 1}, {"a": 2}])
        # Then the worker serves it
        assert job.wait(timeout=30).state is JobState.SUCCEEDED
        assert job.results() == {0: {"a": 1}, 1: {"a": 2}}
        q.close()
        assert stop(worker) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        if server is not None:
            server.terminate()
            server.wait(10)


def test_redis_wait_bounds_the_wait_with_one_line_and_exit_3(
        tmp_path: Path, queue_name: str) -> None:
    # Given no Redis, and a worker that may wait one second for it
    log = tmp_path / "worker.log"
    worker = start_worker(f"redis://127.0.0.1:{free_port()}/0", queue_name, log,
                          "--redis-wait", "1")
    # Then it gives up with exit code 3 and one line saying why
    assert worker.wait(30) == ExitCode.REDIS_UNAVAILABLE
    last = log.read_text().strip().splitlines()[-1]
    assert last.startswith("streamq: cannot reach Redis after"), last
    assert "Traceback" not in log.read_text()


class _State:
    """Puts a private redis-server into one transient state, and takes it out again."""

    def __init__(self, r: redis.Redis, tmp: Path) -> None:
        self.r = r
        self.tmp = tmp
        self.thread: threading.Thread | None = None

    def enter(self, name: str) -> None:
        getattr(self, f"enter_{name.lower()}")()

    def leave(self, name: str) -> None:
        getattr(self, f"leave_{name.lower()}")()

    def enter_oom(self) -> None:
        self.r.config_set("maxmemory", 1)

    def leave_oom(self) -> None:
        self.r.config_set("maxmemory", 0)

    def enter_busy(self) -> None:
        self.r.config_set("busy-reply-threshold", 100)
        other = redis.Redis.from_url(self.url)

        def spin() -> None:
            try:
                other.eval("while true do end", 0)
            except redis.RedisError:
                pass  # killed
            finally:
                other.close()

        self.thread = threading.Thread(target=spin, daemon=True)
        self.thread.start()
        time.sleep(0.3)

    def leave_busy(self) -> None:
        wait_until(lambda: self._try(self.r.script_kill), 10, "SCRIPT KILL")
        assert self.thread is not None
        self.thread.join(10)

    def enter_loading(self) -> None:
        self.r.execute_command("DEBUG", "POPULATE", 50_000, "filler")
        self.r.config_set("key-load-delay", 50)  # microseconds per key (sleeps run longer)
        self.r.config_set("loading-process-events-interval-bytes", 1024)
        other = redis.Redis.from_url(self.url, socket_timeout=120)

        def reload() -> None:
            try:
                other.execute_command("DEBUG", "RELOAD")
            finally:
                other.close()

        self.thread = threading.Thread(target=reload, daemon=True)
        self.thread.start()

    def leave_loading(self) -> None:
        assert self.thread is not None
        self.thread.join(60)
        self.r.config_set("key-load-delay", 0)

    def enter_readonly(self) -> None:
        # a replica of a master that never answers: it keeps its data, refuses writes
        self.r.execute_command("REPLICAOF", "127.0.0.1", free_port())

    def leave_readonly(self) -> None:
        self.r.execute_command("REPLICAOF", "NO", "ONE")

    def enter_misconf(self) -> None:
        gone = self.tmp / "gone"
        gone.mkdir()
        self.r.config_set("save", "3600 1")
        self.r.config_set("dir", str(gone))
        gone.rmdir()
        self.r.bgsave()
        wait_until(lambda: self.r.info("persistence")["rdb_last_bgsave_status"] == "err", 10,
                   "a failed background save")

    def leave_misconf(self) -> None:
        self.r.config_set("dir", str(self.tmp))
        self.r.config_set("stop-writes-on-bgsave-error", "no")

    def enter_clusterdown(self) -> None:
        pass  # the server started as a cluster node without slots

    def leave_clusterdown(self) -> None:
        self.r.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        wait_until(lambda: b"cluster_state:ok" in self.r.execute_command("CLUSTER", "INFO"),
                   20, "the cluster to serve its slots")

    @staticmethod
    def _try(fn: Callable[[], Any]) -> bool:
        try:
            fn()
            return True
        except redis.ResponseError:
            return False

    url = ""


#: what each state makes the worker log: Redis's error word, or the class redis-py
#: made of it (it strips the word of some)
STATES = {"OOM": ("OOM", "OutOfMemoryError"), "BUSY": ("BUSY", "BusyError"),
          "LOADING": ("LOADING", "BusyLoadingError"), "READONLY": ("READONLY", "ReadOnlyError"),
          "MISCONF": ("MISCONF", "MisconfError"), "CLUSTERDOWN": ("CLUSTERDOWN", "ClusterDown")}


@pytest.mark.parametrize("state", list(STATES))
def test_an_idle_worker_survives_a_transient_redis_state(
        state: str, tmp_path: Path, queue_name: str) -> None:
    extra: tuple[str, ...] = ("--enable-debug-command", "yes", "--enable-protected-configs",
                              "yes")
    if state == "CLUSTERDOWN":
        # the bus port is named: the default (port + 10000) may not exist
        extra += ("--cluster-enabled", "yes", "--cluster-config-file",
                  str(tmp_path / "nodes.conf"), "--cluster-port", str(free_port()))
    server, url = start_redis(tmp_path, *extra)
    try:
        _survive(state, url, tmp_path, queue_name)
    finally:
        server.kill()
        server.wait(10)


def test_a_busy_worker_of_a_rate_limited_queue_survives_a_busy_redis(
        tmp_path: Path, queue_name: str) -> None:
    # (its slots read the queue's limits every round: a read refused by a busy Redis
    # once ended a slot's loop, and the live heartbeat kept that slot's tokens leased)
    server, url = start_redis(tmp_path, "--enable-debug-command", "yes",
                              "--enable-protected-configs", "yes")
    r = redis.Redis.from_url(url, socket_timeout=60)
    log = tmp_path / "worker.log"
    worker = None
    try:
        # Given a worker busy with a job of a queue that has a (high) rate limit
        q = Queue(queue_name, url)
        q.set_rate(100_000)
        job = q.submit([{"n": i, "sleep": 0.01} for i in range(400)], concurrency=2)
        worker = start_worker(url, queue_name, log, "--concurrency", "2",
                              handler="tests.handlers:nap")
        wait_until(lambda: q.status(job.id).done > 20, 30, "work under way")
        # When Redis is busy for a while
        states = _State(r, tmp_path)
        states.url = url
        states.enter("BUSY")
        time.sleep(1.5)  # (real time: how long the fault lasts is the scenario)
        states.leave("BUSY")
        # Then the worker goes on and, with a reaper for the entries whose acks Redis
        # refused, the job completes, with no error in the worker's log
        env = dict(os.environ, STREAMQ_REDIS_URL=url, PYTHONPATH=str(ROOT))
        reaper = subprocess.Popen(
            [sys.executable, "-m", "streamq", "reaper", queue_name, "--interval", "0.5",
             "--min-idle", "2", "--log-level", "WARNING"], env=env, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            job.wait(timeout=60)
        except Exception:
            raise AssertionError(f"{q.status(job.id)}\n{log.read_text()[-3000:]}") from None
        assert worker.poll() is None
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
        assert stop(worker) == 0
        reaper.kill()
        reaper.wait(10)
        q.close()
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait(10)
        r.close()
        server.kill()
        server.wait(10)


def _survive(state: str, url: str, tmp: Path, queue_name: str) -> None:
    r = redis.Redis.from_url(url, socket_timeout=60)
    states = _State(r, tmp)
    states.url = url
    log = tmp / "worker.log"
    # Given an idle worker (registered, unless the server serves no key at all)
    worker = start_worker(url, queue_name, log)
    try:
        if state != "CLUSTERDOWN":
            wait_until(lambda: r.zcard(QueueKeys(queue_name).workers) == 1, 30, "registration")
        # When Redis enters the state for a while
        states.enter(state)
        def met() -> bool:
            assert worker.poll() is None, f"the worker died: {log.read_text()[-3000:]}"
            return any(w in log.read_text() for w in STATES[state])

        if state == "OOM":
            # an idle worker's own calls run under OOM (settle, heartbeat: functions
            # flagged allow-oom, so a full Redis can still drain); what OOM refuses is
            # new work, which a producer meets whole (nothing half written)
            refused = Queue(queue_name, url)
            refused.scripts.outlast_s = 0  # (said at once: a queue client waits it out)
            with pytest.raises(ConnectionFailed, match="used memory"):
                refused.submit([{"n": 0}, {"n": 0}])
        else:
            wait_until(met, 30, f"the worker to meet {state}")
        # several heartbeats and idle rounds in that state (real time: most of these
        # states refuse the beats that would show them, so they cannot be counted)
        time.sleep(1.0)
        assert worker.poll() is None, log.read_text()[-3000:]
        states.leave(state)
        # Then the worker is still there, and serves a job submitted afterwards
        q = Queue(queue_name, url)
        job = q.submit([{"n": 1}, {"n": 2}])
        assert job.wait(timeout=60).state is JobState.SUCCEEDED, log.read_text()[-3000:]
        q.close()
        assert worker.poll() is None
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
        assert stop(worker) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        r.close()


# -- retries without a reaper -----------------------------------------------------------


def test_a_failed_sub_request_is_retried_with_no_reaper_running(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    # Given workers and no reaper, and a handler that fails each first attempt with a
    # 300 ms retry delay
    procs.worker(queue_name, "tests.handlers:fail_once", "--concurrency", "2")
    procs.worker(queue_name, "tests.handlers:fail_once", "--concurrency", "2")
    q = Queue(queue_name, redis_url)
    # When jobs are submitted (their tokens park while their retries wait)
    jobs = [q.submit([{"n": i, "delay": 0.3}], concurrency=1) for i in range(3)]
    # Then every job completes, each sub-request having run twice
    for i, job in enumerate(jobs):
        assert job.wait(timeout=10).state is JobState.SUCCEEDED
        assert job.results() == {0: 2 * i}
        assert int(r.get(f"starts:{job.id}:0") or 0) == 2
    q.close()


# -- health ----------------------------------------------------------------------------


def health(url: str, id_file: Path) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["health", "--worker", "--id-file", str(id_file), "-v",
                                   "--redis-url", url])
    return res.exit_code, res.output


def test_worker_health_follows_its_own_heartbeat(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    # Given a live worker that writes its id file
    id_file = tmp_path / "worker.json"
    worker = start_worker(redis_url, queue_name, tmp_path / "worker.log", "--id-file",
                          str(id_file))
    try:
        wait_until(id_file.exists, 30, "the id file")
        # Then its health check passes
        code, out = health(redis_url, id_file)
        assert code == ExitCode.OK, out
        # When its process is stopped (its loop makes no progress) past three beats
        worker.send_signal(signal.SIGSTOP)
        # (real time: three of its 0.2 s periods pass since its last beat, by Redis's clock)
        me = json.loads(id_file.read_text())
        qk, wid = QueueKeys(queue_name), str(me["worker_id"])
        assert float(me["heartbeat_s"]) == 0.2
        rc = connect(redis_url)
        try:
            wait_until(lambda: server_ms(rc, qk.workers)
                       - int(rc.hget(qk.worker(wid), "beat") or 0) > 3 * 200, 30,
                       "three heartbeat periods since the stopped worker's last beat")
        finally:
            rc.close()
        # Then the check fails with UNHEALTHY
        code, out = health(redis_url, id_file)
        assert code == ExitCode.UNHEALTHY, out
        assert "last beat" in out
        # and passes again once it runs again
        worker.send_signal(signal.SIGCONT)
        wait_until(lambda: health(redis_url, id_file)[0] == ExitCode.OK, 30, "healthy again")
        assert stop(worker) == 0
        assert not id_file.exists()
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGCONT)
            worker.kill()
            worker.wait(10)


def test_worker_health_without_a_worker_is_unhealthy(redis_url: str, tmp_path: Path) -> None:
    code, out = health(redis_url, tmp_path / "missing.json")
    assert code == ExitCode.UNHEALTHY and "no worker id" in out
