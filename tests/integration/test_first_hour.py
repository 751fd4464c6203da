"""A newcomer's first hour, through the ``streamq`` command as a shell runs it (real
processes, one private redis-server): a handler next to where the worker starts is
found; a handler module that fails on import is named with its file and line; Ctrl-C
says what it does at once and a second one forces; a mistyped queue name is refused
instead of succeeding; a ``Queue`` finds its Redis in the environment and connects on
first use."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import start_redis, wait_until

from streamq import ConfigError, JobState, Queue

#: the console script a shell runs (its sys.path does not start at the current folder,
#: as ``python -m`` does)
STREAMQ = str(Path(sys.executable).with_name("streamq"))


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STREAMQ_HOOK")}
    return dict(env, STREAMQ_REDIS_URL=url)


def _shell(url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STREAMQ, *args], cwd=cwd, env=_env(url), text=True,
                          capture_output=True, timeout=60)


def _worker(url: str, cwd: Path, queue: str, handler: str) -> subprocess.Popen[str]:
    return subprocess.Popen([STREAMQ, "worker", queue, "--handler", handler, "--heartbeat",
                             "0.3"], cwd=cwd, env=_env(url), text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_a_handler_next_to_the_worker_is_found_without_pythonpath(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    # Given app.py in the folder the worker starts in, and no PYTHONPATH
    (tmp_path / "app.py").write_text("def handle(p):\n    return {'seen': p}\n")
    q = Queue(queue_name, redis_url)
    job = q.submit([1])
    # When `streamq worker QUEUE --handler app:handle` starts there
    proc = _worker(redis_url, tmp_path, queue_name, "app:handle")
    try:
        # Then it serves the job
        assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
        assert q.results(job.id) == {0: {"seen": 1}}
    finally:
        proc.kill()
        proc.communicate()
    q.close()


def test_a_handler_module_that_fails_on_import_is_named_with_its_file_and_line(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    # Given a handler module that raises while it is imported, on its line 3
    (tmp_path / "rterr.py").write_text("import os\n\nraise RuntimeError('config missing')\n")
    # When a worker is started with it
    res = _shell(redis_url, tmp_path, "worker", queue_name, "--handler", "rterr:handle")
    # Then one line names the error, the file and the line; exit 2, no traceback
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "RuntimeError: config missing" in line and "rterr.py:3" in line, res.stderr
    assert "Traceback" not in res.stderr
    # And a module that is not there says where it was looked for
    res = _shell(redis_url, tmp_path, "worker", queue_name, "--handler", "nosuch:handle")
    assert res.returncode == 2 and str(tmp_path) in res.stderr, res.stderr


def test_a_handler_that_cannot_take_a_payload_stops_the_worker_at_start(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    # Given a job waiting, and a handler of two required arguments
    (tmp_path / "two.py").write_text("def handle(payload, extra):\n    return payload\n")
    q = Queue(queue_name, redis_url)
    job = q.submit([1])
    # When a worker is started with it
    res = _shell(redis_url, tmp_path, "worker", queue_name, "--handler", "two:handle")
    # Then it does not start: one line names the handler and what it must take, exit 2
    assert res.returncode == 2, res.stderr
    assert "handle(payload, extra) must take one argument" in res.stderr.strip().splitlines()[-1]
    assert "Traceback" not in res.stderr
    # And the job was not run (no attempt failed with a TypeError): it still waits
    st = q.status(job.id)
    assert st.state is JobState.ACTIVE and st.failed == 0 and st.done == 0, st
    q.close()


def test_ctrl_c_says_warm_shutdown_at_once_and_a_second_one_forces(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    # Given a worker running a 30 s handler
    started = tmp_path / "started"
    (tmp_path / "slow.py").write_text(
        "import pathlib, time\n"
        f"def handle(p):\n    pathlib.Path({str(started)!r}).write_text('1')\n"
        "    time.sleep(30)\n    return p\n")
    q = Queue(queue_name, redis_url)
    q.submit([1])
    proc = _worker(redis_url, tmp_path, queue_name, "slow:handle")
    assert proc.stderr is not None
    os.set_blocking(proc.stderr.fileno(), False)
    said: list[str] = []

    def heard(fragment: str) -> bool:
        # raw non-blocking reads of the pipe (a text wrapper's read() of a non-blocking
        # pipe can fail between two chunks)
        try:
            said.append(os.read(proc.stderr.fileno(), 65536).decode())  # type: ignore[union-attr]
        except BlockingIOError:
            pass
        return fragment in "".join(said)

    try:
        wait_until(started.exists, 30, "the handler to start")
        # When Ctrl-C is pressed once
        proc.send_signal(signal.SIGINT)
        # Then it says at once that it drains, and keeps running the handler
        wait_until(lambda: heard("warm shutdown"), 5, "the warm shutdown line")
        assert proc.poll() is None
        # And a second Ctrl-C stops it now, with 130 (128 + SIGINT)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 130
        assert heard("cold shutdown")
    finally:
        proc.kill()
        proc.communicate()
    q.close()


@pytest.mark.parametrize("command", [
    ["pause", "--no-wait"], ["resume"], ["rate"], ["rate", "--per-second", "5"],
    ["health", "--queue"],
])
def test_a_mistyped_queue_name_is_not_found_and_leaves_no_key(
        redis_url: str, r: Any, command: list[str], tmp_path: Path) -> None:
    # Given a queue that has work, and a mistyped name of it
    q = Queue("images", redis_url)
    q.submit([1], job_id="shared1")
    # When a command is given the mistyped name
    args = ([command[0], "imagez", *command[1:]] if command[0] != "health"
            else ["health", "--queue", "imagez"])
    res = _shell(redis_url, tmp_path, *args)
    # Then it exits 4 (not found) with one line, and wrote nothing of it
    assert res.returncode == 4, (res.stdout, res.stderr)
    assert "imagez" in res.stderr and "not found" in res.stderr
    assert r.keys("*imagez*") == []
    q.close()


def test_pause_and_rate_with_create_act_on_a_queue_ahead_of_its_work(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    # Given a queue name with nothing of it in Redis yet
    # When it is paused with --create
    res = _shell(redis_url, tmp_path, "pause", queue_name, "--no-wait", "--create")
    # Then the pause holds, and the queue is known from then on
    assert res.returncode == 0, res.stderr
    assert _shell(redis_url, tmp_path, "status", queue_name).returncode == 0
    assert _shell(redis_url, tmp_path, "resume", queue_name).returncode == 0


def test_a_queue_finds_its_redis_in_the_environment(
        redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMQ_REDIS_URL", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(ConfigError, match="STREAMQ_REDIS_URL"):
        Queue(queue_name)
    for var in ("REDIS_URL", "STREAMQ_REDIS_URL"):
        monkeypatch.setenv(var, redis_url)
        q = Queue(queue_name)
        job = q.submit([1])
        assert q.status(job.id).state is JobState.ACTIVE
        q.close()
    # STREAMQ_REDIS_URL wins over REDIS_URL
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    q = Queue(queue_name)
    assert q.redis.ping()
    q.close()


def test_constructing_a_queue_sends_nothing_until_its_first_use(
        redis_url: str, queue_name: str, r: Any) -> None:
    def received() -> int:
        return int(r.info("stats")["total_connections_received"])

    # Given a server, a count of the connections it has received so far
    before = received()
    # When a Queue is constructed (as an app does at import time) and closed unused
    q = Queue(queue_name, redis_url)
    q.close()
    # Then no connection was made
    assert received() == before
    # And a Queue on a server that is not there constructs too (it fails on first use)
    Queue(queue_name, "redis://127.0.0.1:1/0").close()
    # And a bad URL is refused at once, not on first use
    with pytest.raises(ConfigError, match="database must be a number"):
        Queue(queue_name, redis_url.rsplit("/", 1)[0] + "/images")
    # And the first call connects and works
    q = Queue(queue_name, redis_url)
    job = q.submit([1])
    assert received() > before and q.status(job.id).state is JobState.ACTIVE
    q.close()


def test_results_and_queues_are_everyday_commands(
        redis_url: str, queue_name: str, tmp_path: Path, workers: Any) -> None:
    import json

    # Given a finished job of two sub-requests (a bytes result among them), and a worker
    q = Queue(queue_name, redis_url)
    job = q.submit([{"n": 1}, b"raw"])
    workers(queue_name, lambda p: p)
    assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    # When its results are asked for
    res = _shell(redis_url, tmp_path, "results", queue_name, job.id, "--json")
    # Then every result is there by index, bytes as base64
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["state"] == "succeeded" and doc["results"] == {
        "0": {"n": 1}, "1": {"base64": "cmF3"}}
    table = _shell(redis_url, tmp_path, "results", queue_name, job.id)
    assert "2 of 2 results" in table.stdout and "b'raw'" in table.stdout
    # And an unknown job is not found (4)
    assert _shell(redis_url, tmp_path, "results", queue_name, "nosuch").returncode == 4
    # And the queue is listed with its live worker
    listed = json.loads(_shell(redis_url, tmp_path, "queues", "--json").stdout)
    assert {"queue": queue_name, "live_workers": 1} in listed["queues"]
    q.close()


def test_jobs_lists_filters_and_searches_a_queues_jobs(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    import json

    # Given queued jobs of two clients (one small, one of its own stream) and one
    # found by its dedup key
    q = Queue(queue_name, redis_url)
    a = q.submit([1], client="alpha")
    b = q.submit([1, 2], client="beta", priority=3)
    c = q.submit([1], client="beta", dedup_key="order-7")
    # When the queue's jobs are listed
    doc = json.loads(_shell(redis_url, tmp_path, "jobs", queue_name, "--json").stdout)
    # Then every job is there, newest first, with its client and priority
    assert {row["job_id"] for row in doc["jobs"]} == {a.id, b.id, c.id}
    assert doc["next_cursor"] is None
    # And filters and search narrow it
    beta = json.loads(_shell(redis_url, tmp_path, "jobs", queue_name, "--client", "beta",
                             "--json").stdout)
    assert {row["job_id"] for row in beta["jobs"]} == {b.id, c.id}
    found = json.loads(_shell(redis_url, tmp_path, "jobs", queue_name, "--search", "order-7",
                              "--json").stdout)
    assert [row["job_id"] for row in found["jobs"]] == [c.id]
    table = _shell(redis_url, tmp_path, "jobs", queue_name, "--priority", "3")
    assert b.id in table.stdout and a.id not in table.stdout
    # And a bad state is a usage error, an unknown queue not found
    assert _shell(redis_url, tmp_path, "jobs", queue_name, "--state", "done").returncode == 2
    assert _shell(redis_url, tmp_path, "jobs", "nosuchqueue").returncode == 4
    q.close()


def test_the_version_is_one_flag_away(tmp_path: Path, redis_url: str) -> None:
    from streamq import __version__

    for flag in ("-V", "--version"):
        res = _shell(redis_url, tmp_path, flag)
        assert (res.returncode, res.stdout.strip()) == (0, f"streamq {__version__}")


def test_a_stalled_job_recovers_with_workers_alone(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """No reaper: a worker SIGKILLed inside a job's handler, a new worker started; the
    new worker's own recovery passes hand the stalled entry on (min idle 1 s here)."""
    # Given a handler that hangs on its first run, and a worker running it
    started = tmp_path / "started"
    (tmp_path / "once.py").write_text(
        "import pathlib, time\n"
        f"def handle(p):\n    f = pathlib.Path({str(started)!r})\n"
        "    if not f.exists():\n        f.write_text('1')\n        time.sleep(60)\n"
        "    return 'done'\n")
    q = Queue(queue_name, redis_url)
    job = q.submit(["x"], job_id="stalls")
    env = dict(_env(redis_url), STREAMQ_RECOVER="1", STREAMQ_MIN_IDLE="1")
    args = [STREAMQ, "worker", queue_name, "--handler", "once:handle", "--heartbeat", "0.3",
            "--lease-ms", "1000"]
    first = subprocess.Popen(args, cwd=tmp_path, env=env, stderr=subprocess.DEVNULL)
    try:
        wait_until(started.exists, 30, "the first run to start")
        # When that worker is SIGKILLed and another one started (no reaper anywhere)
        first.kill()
        first.wait()
        second = subprocess.Popen(args, cwd=tmp_path, env=env, stderr=subprocess.DEVNULL)
        try:
            # Then the job finishes, run again by the second worker
            st = q.wait(job.id, timeout=120)  # passes every 15 s, min idle 1 s here
            assert st.state is JobState.SUCCEEDED and q.results(job.id) == {0: "done"}
        finally:
            second.kill()
            second.wait()
    finally:
        first.kill()
        first.wait()
    q.close()


def test_times_are_shown_with_their_zone_not_as_raw_ms(
        redis_url: str, queue_name: str, tmp_path: Path, workers: Any) -> None:
    import re

    from streamq import NonRetryable

    # Given a job whose one sub-request was dead-lettered
    q = Queue(queue_name, redis_url)
    job = q.submit(["x"], job_id="dead-one")

    def refuse(p: Any) -> Any:
        raise NonRetryable("no")

    workers(queue_name, refuse)
    assert q.wait(job.id, timeout=30).state is JobState.FAILED
    (dead,) = q.dead_letters(job_id=job.id)
    # When the dead letter and the job's status are shown
    shown = _shell(redis_url, tmp_path, "dlq", "show", queue_name, dead.id).stdout
    status = _shell(redis_url, tmp_path, "status", queue_name, job.id).stdout
    # Then their times read as dates with a zone offset, and no raw ms is left
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d"
    assert re.search(stamp, shown) and not re.search(r"\b1[6-9]\d{11}\b(?!-)", shown), shown
    assert re.search(r"created_ms\s+" + stamp, status), status
    q.close()


def test_the_redis_url_goes_before_or_after_the_command(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    q = Queue(queue_name, redis_url)
    job = q.submit([1])
    env = {k: v for k, v in _env(redis_url).items() if k != "STREAMQ_REDIS_URL"}
    for args in (["--redis-url", redis_url, "status", queue_name, job.id],
                 ["status", queue_name, job.id, "--redis-url", redis_url]):
        res = subprocess.run([STREAMQ, *args], cwd=tmp_path, env=env, text=True,
                             capture_output=True, timeout=60)
        assert res.returncode == 0 and job.id in res.stdout, (args, res.stderr)
    q.close()


def test_an_empty_table_says_none(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    q = Queue(queue_name, redis_url)
    q.submit([1])
    res = _shell(redis_url, tmp_path, "workers", queue_name)
    assert res.returncode == 0 and res.stdout.strip() == (
        f"workers of queue {queue_name}: none registered"), res.stdout
    res = _shell(redis_url, tmp_path, "dlq", "list", queue_name)
    assert res.stdout.strip() == f"dead letters of {queue_name}: none", res.stdout
    q.close()


def test_a_failure_shows_its_traceback_in_the_log_the_dead_letter_and_submit_wait(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    # Given a handler that fails two calls deep, on a line of its own
    (tmp_path / "bad.py").write_text(
        "def parse(p):\n"
        "    return int(p['n']) / 0\n"
        "\n"
        "def handle(p):\n"
        "    return parse(p)\n")
    worker = subprocess.Popen([STREAMQ, "worker", queue_name, "--handler", "bad:handle",
                               "--heartbeat", "0.3"], cwd=tmp_path, env=_env(redis_url),
                              text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # When a job of two sub-requests is submitted and waited for, one try each
        res = _shell(redis_url, tmp_path, "submit", queue_name, '{"n": 1}', '{"n": 2}',
                     "--max-deliveries", "1", "--wait", "--timeout", "60")
    finally:
        worker.send_signal(signal.SIGTERM)
        _, log = worker.communicate(timeout=30)
    # Then `submit --wait` names each failed sub-request's error and where to read it
    assert res.returncode == 1, res.stdout + res.stderr
    lines = [ln for ln in res.stdout.splitlines() if "ZeroDivisionError: division by zero" in ln]
    assert len(lines) == 2 and all("streamq dlq show" in ln for ln in lines), res.stdout
    # And the worker's log holds the traceback, down to the failing line
    assert "Traceback (most recent call last)" in log and "bad.py\", line 2, in parse" in log, log
    # And `dlq show` prints the dead letter's traceback below its fields
    dead_id = lines[0].rsplit(" ", 1)[1].rstrip(")")
    shown = _shell(redis_url, tmp_path, "dlq", "show", queue_name, dead_id)
    assert shown.returncode == 0, shown.stderr
    assert "ZeroDivisionError: division by zero" in shown.stdout
    assert "Traceback (most recent call last)" in shown.stdout
    assert 'line 5, in handle' in shown.stdout and 'line 2, in parse' in shown.stdout
    # And --json gives the error's summary and its traceback apart
    doc = json.loads(_shell(redis_url, tmp_path, "dlq", "show", queue_name, dead_id,
                            "--json").stdout)
    assert doc["error"] == "ZeroDivisionError: division by zero"
    assert doc["traceback"].startswith("Traceback (most recent call last):\n")
    assert doc["traceback"].rstrip().endswith("ZeroDivisionError: division by zero")


def test_streamq_web_refuses_credentials_redis_refuses(tmp_path: Path) -> None:
    # Given a Redis that wants a password
    server, url = start_redis(tmp_path, "--requirepass", "right-one", ping=False)
    port = url.rsplit(":", 1)[1].split("/")[0]
    try:
        # When the dashboard starts with a wrong one
        res = subprocess.run(
            [STREAMQ, "web", "--no-auth", "--port", "0", "--redis-url",
             f"redis://:wrong-one@127.0.0.1:{port}/0"], cwd=tmp_path,
            env=_env(""), text=True, capture_output=True, timeout=60)
        # Then it does not start: one line says why, exit 3
        assert res.returncode == 3, res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "refused the credentials of --redis-url" in lines[0], res.stderr
        assert "wrong-one" not in res.stderr  # the password is never shown
    finally:
        server.kill()
        server.wait()


def test_purge_cancels_every_unfinished_job_on_both_lanes(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    # Given queued work on both lanes (small jobs and jobs on their own stream), and a
    # job that ended before
    (tmp_path / "app.py").write_text(
        "import os\n"
        "def handle(p):\n"
        "    open(os.path.join(os.path.dirname(__file__), 'ran'), 'a').write('x')\n"
        "    return p\n")
    q = Queue(queue_name, redis_url)
    small = [q.submit([i]) for i in range(3)]
    big = [q.submit([1, 2, 3], job_id=f"big-{i}") for i in range(2)]
    # When `streamq purge` is asked and the answer is no, nothing changes
    res = subprocess.run([STREAMQ, "purge", queue_name], input="n\n", cwd=tmp_path,
                         env=_env(redis_url), text=True, capture_output=True, timeout=60)
    assert res.returncode == 1 and "cancel 5 unfinished jobs" in res.stderr, res.stderr
    assert all(q.status(j.id).state is JobState.ACTIVE for j in small + big)
    # And with --yes every unfinished job is cancelled, on both lanes
    res = _shell(redis_url, tmp_path, "purge", queue_name, "--yes", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"queue": queue_name, "cancelled": 5}
    assert all(q.status(j.id).state is JobState.CANCELLED for j in small + big)
    assert q.unfinished() == []
    # Then a worker started after runs none of it
    proc = _worker(redis_url, tmp_path, queue_name, "app:handle")
    try:
        done = q.submit(["after"])
        assert q.wait(done.id, timeout=30).state is JobState.SUCCEEDED
    finally:
        proc.kill()
        proc.communicate()
    assert (tmp_path / "ran").read_text() == "x"  # only the job submitted after
    # And purging again cancels nothing; an unknown queue is not found (exit 4)
    assert q.purge() == 0
    assert _shell(redis_url, tmp_path, "purge", "nosuch-queue", "--yes").returncode == 4
    q.close()


def test_delete_removes_a_finished_job_and_refuses_an_unfinished_one(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    # Given a finished small job, a finished job on its own stream and a queued job
    q = Queue(queue_name, redis_url)
    small, big = q.submit(["a"]), q.submit(["b", "c"], job_id=f"{queue_name}-big")
    for job in (small, big):
        q.cancel(job.id, wait=False)  # (finished: cancelled)
    queued = q.submit(["d"])
    # When `streamq delete` is asked and the answer is no, nothing changes
    res = subprocess.run([STREAMQ, "delete", queue_name, small.id], input="n\n", cwd=tmp_path,
                         env=_env(redis_url), text=True, capture_output=True, timeout=60)
    assert res.returncode == 1 and f"delete job {small.id} (cancelled)" in res.stderr
    assert q.status(small.id).state is JobState.CANCELLED
    # And with --yes each finished job is deleted, on both lanes
    for job in (small, big):
        res = _shell(redis_url, tmp_path, "delete", queue_name, job.id, "--yes", "--json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == {"queue": queue_name, "job_id": job.id,
                                          "deleted": True}
        assert _shell(redis_url, tmp_path, "status", queue_name, job.id).returncode == 4
    # Then deleting again finds no job (exit 4), one line on stderr
    res = _shell(redis_url, tmp_path, "delete", queue_name, small.id, "--yes")
    assert res.returncode == 4 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    # And an unfinished job is refused (a usage error, exit 2) unless --cancel
    res = _shell(redis_url, tmp_path, "delete", queue_name, queued.id, "--yes")
    assert res.returncode == 2 and "has not finished" in res.stderr, res.stderr
    assert q.status(queued.id).state is JobState.ACTIVE
    res = _shell(redis_url, tmp_path, "delete", queue_name, queued.id, "--yes", "--cancel")
    assert res.returncode == 0 and f"deleted job {queued.id}" in res.stdout, res.stderr
    q.close()


def test_retry_reruns_a_failed_jobs_dead_letters_in_place(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    # Given a handler that fails until a flag file exists, and a job it failed for good
    (tmp_path / "app.py").write_text(
        "import os\n"
        "def handle(p):\n"
        "    if not os.path.exists(os.path.join(os.path.dirname(__file__), 'mended')):\n"
        "        raise ValueError('not yet')\n"
        "    return p\n")
    q = Queue(queue_name, redis_url)
    job = q.submit(["x"], max_deliveries=1)
    proc = _worker(redis_url, tmp_path, queue_name, "app:handle")
    try:
        assert q.wait(job.id, timeout=30).state is JobState.FAILED
        # When the cause is mended and `streamq retry` is run
        (tmp_path / "mended").write_text("")
        res = _shell(redis_url, tmp_path, "retry", queue_name, job.id, "--json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == {"queue": queue_name, "job_id": job.id, "retried": 1}
        # Then the same job succeeds
        assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    finally:
        proc.kill()
        proc.communicate()
    # And a second retry has nothing to do (exit 2), an unknown job is not found (exit 4)
    res = _shell(redis_url, tmp_path, "retry", queue_name, job.id)
    assert res.returncode == 2 and "nothing to retry" in res.stderr, res.stderr
    assert _shell(redis_url, tmp_path, "retry", queue_name, "nosuch").returncode == 4
    q.close()


def test_repeats_are_added_listed_paused_and_removed_from_the_command_line(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """`streamq repeat`: a cron repeat in a time zone and an interval one; a worker alone
    (its recovery thread) submits the interval's ticks and runs them."""
    q = Queue(queue_name, redis_url)
    # Given a handler next to where the shell runs, and two repeats added by the CLI
    (tmp_path / "app.py").write_text("def handle(p):\n    return p['n'] * 10\n")
    res = _shell(redis_url, tmp_path, "repeat", "add", queue_name, "nightly", '{"n": 1}',
                 "--cron", "30 2 * * 1-5", "--tz", "America/New_York", "--priority", "4")
    assert res.returncode == 0, res.stderr
    assert "repeat nightly of queue" in res.stdout and "cron 30 2 * * 1-5" in res.stdout
    res = _shell(redis_url, tmp_path, "repeat", "add", queue_name, "tick", '{"n": 2}',
                 "--every", "1", "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["schedule"] == "every 1 s"
    # Bad input: one line, a usage error, nothing stored; an unknown queue: exit 4
    for bad in (["--cron", "61 * * * *"], ["--cron", "0 3 * * *", "--tz", "Mars/Base"],
                ["--every", "5", "--cron", "0 3 * * *"], ["--every", "0.2"]):
        res = _shell(redis_url, tmp_path, "repeat", "add", queue_name, "bad", "x", *bad)
        assert res.returncode == 2 and "Traceback" not in res.stderr, (bad, res.stderr)
    assert _shell(redis_url, tmp_path, "repeat", "list", "nosuchq").returncode == 4
    # When a worker runs (no reaper), the interval's ticks become jobs it runs
    worker = subprocess.Popen([STREAMQ, "worker", queue_name, "--handler", "app:handle",
                               "--heartbeat", "0.3"], cwd=tmp_path,
                              env=dict(_env(redis_url), STREAMQ_RECOVER="1"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: q.repeats.get("tick").last_job is not None, 30, "a tick")
        job = q.repeats.get("tick").last_job or ""
        assert q.wait(job, timeout=30).state is JobState.SUCCEEDED
        res = _shell(redis_url, tmp_path, "results", queue_name, job, "--json")
        assert res.returncode == 0 and "20" in res.stdout, res.stdout
    finally:
        worker.kill()
        worker.wait()
    # Then the list shows both, pause and resume say what they did, remove asks first
    listed = json.loads(_shell(redis_url, tmp_path, "repeat", "list", queue_name,
                               "--json").stdout)["repeats"]
    assert [(r["name"], r["paused"], r["priority"]) for r in listed] == [
        ("nightly", False, 4), ("tick", False, 50)]
    assert "America/New_York" in _shell(redis_url, tmp_path, "repeat", "list", queue_name).stdout
    assert _shell(redis_url, tmp_path, "repeat", "pause", queue_name, "tick").stdout.strip() == \
        "repeat tick paused"
    assert "was paused already" in _shell(redis_url, tmp_path, "repeat", "pause", queue_name,
                                          "tick").stdout
    assert q.repeats.get("tick").paused
    assert _shell(redis_url, tmp_path, "repeat", "resume", queue_name, "tick").returncode == 0
    res = subprocess.run([STREAMQ, "repeat", "remove", queue_name, "tick"], input="n\n",
                         cwd=tmp_path, env=_env(redis_url), text=True, capture_output=True,
                         timeout=60)
    assert res.returncode == 1 and q.repeats.get("tick")
    res = _shell(redis_url, tmp_path, "repeat", "remove", queue_name, "tick", "--yes")
    assert res.returncode == 0 and [r.name for r in q.repeats.list()] == ["nightly"]
    res = _shell(redis_url, tmp_path, "repeat", "pause", queue_name, "tick")
    assert res.returncode == 2 and "has no repeat 'tick'" in res.stderr, res.stderr
    q.close()


def test_one_job_id_names_a_job_in_each_queue(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    import json

    # Given two queues, each with a worker of its own handler
    (tmp_path / "app.py").write_text("def double(p):\n    return p * 2\n\n\n"
                                     "def negate(p):\n    return -p\n")
    other = f"{queue_name}-b"
    procs = [_worker(redis_url, tmp_path, queue_name, "app:double"),
             _worker(redis_url, tmp_path, other, "app:negate")]
    try:
        # When the same job id is submitted to each from the CLI, and both are waited for
        done = [_shell(redis_url, tmp_path, "submit", q, v, "--job-id", "shared1", "--wait",
                       "--timeout", "60") for q, v in ((queue_name, "3"), (other, "5"))]
        # Then both were accepted as two jobs, and each ran with its own queue's handler
        for res in done:
            assert res.returncode == 0, res.stdout + res.stderr
        got = [json.loads(_shell(redis_url, tmp_path, "results", q, "shared1", "--json").stdout)
               for q in (queue_name, other)]
        assert [g["results"] for g in got] == [{"0": 6}, {"0": -5}]
        # And a third queue does not know the id
        assert _shell(redis_url, tmp_path, "status", f"{queue_name}-c", "shared1").returncode == 4
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=30)


def test_setup_moves_jobs_of_the_earlier_key_layout(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    import redis as redis_py

    from streamq.storage.migrate import PARTS

    # Given an unfinished job and a finished one stored as earlier releases stored them
    # (``sq:{<job id>}:<part>``: their keys renamed there)
    q = Queue(queue_name, redis_url)
    done = q.submit(["a"], job_id=f"{queue_name}-old-done")
    (tmp_path / "app.py").write_text("def up(p):\n    return p.upper()\n")
    first = _worker(redis_url, tmp_path, queue_name, "app:up")
    try:
        assert q.wait(done.id, timeout=30).state is JobState.SUCCEEDED
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
    waiting = q.submit(["b", "c"], job_id=f"{queue_name}-old-open")
    r = redis_py.Redis.from_url(redis_url)
    ttl_before = r.pttl(q.keys.job(done.id).meta)
    for job in (done.id, waiting.id):
        for part in PARTS:
            key = getattr(q.keys.job(job), part)
            if r.exists(key):
                r.rename(key, f"sq:{{{job}}}:{part}")
    assert q.keys.job(waiting.id).meta.encode() not in r.keys("sq:*")
    # When `streamq setup` runs (the upgrade's step) and then a worker starts
    res = _shell(redis_url, tmp_path, "setup")
    assert res.returncode == 0 and "moved 2 job(s)" in res.stdout, res.stdout + res.stderr
    again = _shell(redis_url, tmp_path, "setup")
    assert "moved" not in again.stdout  # nothing is left to move
    second = _worker(redis_url, tmp_path, queue_name, "app:up")
    try:
        # Then the unfinished job runs to its end, and the finished one kept its result
        # and its time to live
        assert q.wait(waiting.id, timeout=30).state is JobState.SUCCEEDED
        assert q.results(waiting.id) == {0: "B", 1: "C"}
        assert q.results(done.id) == {0: "A"}
        assert 0 < r.pttl(q.keys.job(done.id).meta) <= ttl_before
        assert not r.keys(f"sq:{{{queue_name}-old-*}}:*")
    finally:
        second.send_signal(signal.SIGTERM)
        second.communicate(timeout=30)
    q.close()


def test_a_worker_that_loads_the_library_itself_moves_the_earlier_layout_first(
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    import redis as redis_py

    from streamq.storage.luaload import LIBRARY_NAME
    from streamq.storage.migrate import PARTS

    # Given an unfinished job stored as earlier releases stored it, on a server whose
    # library is not this release's (a development server: no `streamq setup` is run)
    q = Queue(queue_name, redis_url)
    waiting = q.submit(["b", "c"], job_id=f"{queue_name}-old")
    r = redis_py.Redis.from_url(redis_url)
    for part in PARTS:
        key = getattr(q.keys.job(waiting.id), part)
        if r.exists(key):
            r.rename(key, f"sq:{{{waiting.id}}}:{part}")
    r.function_delete(LIBRARY_NAME)
    # When a worker starts (its user may load code: it loads the library itself) and a
    # reaper passes
    (tmp_path / "app.py").write_text("def up(p):\n    return p.upper()\n")
    worker = _worker(redis_url, tmp_path, queue_name, "app:up")
    try:
        # Then the job was moved before any pass could take it for an orphan, and runs
        wait_until(lambda: not r.keys(f"sq:{{{waiting.id}}}:*"), 30, "the old keys moved")
        assert q.wait(waiting.id, timeout=30).state is JobState.SUCCEEDED
        assert q.results(waiting.id) == {0: "B", 1: "C"}
        assert not r.keys(f"sq:{{{waiting.id}}}:*")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=30)
    q.close()
