"""The operator CLI, against a real redis-server, with real jobs in flight,
stalled and dead-lettered: every number shown must equal Redis's own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import Procs, Subscriber, free_port, reaper_passes
from typer.testing import CliRunner, Result

from streamq import JobState, NonRetryable, Queue, Worker
from streamq.base.config import GROUP
from streamq.base.keys import JobKeys, QueueKeys
from streamq.base.members import owner_worker
from streamq.cli import ExitCode, app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def cli(url: str, *args: str, input: str | None = None) -> Result:
    return runner.invoke(app, list(args), input=input, env={"STREAMQ_REDIS_URL": url})


def cli_json(url: str, *args: str) -> Any:
    res = cli(url, *args, "--json")
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def run(url: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, STREAMQ_REDIS_URL=url, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "streamq", *args], input=input, text=True,
                          capture_output=True, env=env, cwd=ROOT, timeout=60)


def one_error_line(stderr: str, code: int, actual: int, fragment: str = "") -> None:
    lines = stderr.strip().splitlines()
    assert actual == code, stderr
    assert len(lines) == 1 and lines[0].startswith("streamq: "), stderr
    assert fragment in lines[0] and "Traceback" not in stderr


def until(cond: Callable[[], Any], timeout: float = 20, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


def echo(payload: Any) -> Any:
    return payload


# -- usage and bad input -----------------------------------------------------------------


def test_help_version_and_usage_errors(redis_url: str) -> None:
    out = run(redis_url, "--help")
    assert out.returncode == 0
    for cmd in ("submit", "status", "pending", "workers", "dlq", "subscribe", "watch", "health",
                "worker", "reaper", "demo", "pipeline"):
        assert cmd in out.stdout
    assert cli(redis_url, "--version").stdout.strip().startswith("streamq ")
    assert cli(redis_url).exit_code == ExitCode.USAGE
    res = cli(redis_url, "status")
    one_error_line(res.stderr, ExitCode.USAGE, res.exit_code, "Missing argument 'QUEUE'")
    res = cli(redis_url, "status", "q", "--bogus")
    one_error_line(res.stderr, ExitCode.USAGE, res.exit_code, "No such option: --bogus")
    res = cli(redis_url, "worker", "q", "--handler", "tests.handlers:echo", "--log-level", "LOUD")
    one_error_line(res.stderr, ExitCode.USAGE, res.exit_code, "log level")


BAD = [
    (["status", "q", "--redis-url", "redis://127.0.0.1:1/0"], 3, "cannot reach Redis"),
    (["status", "q", "--redis-url", "foo://x"], 2, "invalid Redis URL"),
    (["status", "nosuchqueue"], 4, "queue 'nosuchqueue' not found"),
    (["status", "KNOWN", "nosuchjob"], 4, "job 'nosuchjob' not found"),
    (["status", "KNOWN", "bad job id"], 2, "invalid job id"),
    (["status", "bad queue"], 2, "invalid queue name"),
    (["pending", "KNOWN", "nosuchjob"], 4, "not found"),
    (["pending", "nosuchqueue"], 4, "not found"),
    (["workers", "nosuchqueue"], 4, "not found"),
    (["watch", "nosuchqueue", "--once"], 4, "not found"),
    (["subscribe", "KNOWN", "nosuchjob", "--until-done"], 4, "job 'nosuchjob' not found"),
    (["subscribe", "KNOWN", "--until-done"], 2, "needs job ids"),
    (["dlq", "list", "nosuchqueue"], 4, "not found"),
    (["dlq", "show", "KNOWN", "1-0"], 4, "no dead letter '1-0'"),
    (["dlq", "show", "KNOWN", "abc"], 2, "not a dead-letter id"),
    (["dlq", "replay", "KNOWN"], 2, "give dead-letter ids or --all"),
    (["submit", "KNOWN"], 2, "give payloads"),
    (["submit", "KNOWN", "1", "--priority", "100"], 2, "--priority"),
    (["submit", "KNOWN", "1", "--redis-url", "redis://127.0.0.1:1/0"], 3, "cannot reach Redis"),
    (["worker", "q", "--handler", "nope"], 2, "not of the form module:function"),
    (["worker", "q", "--handler", "no_such_module:fn"], 2, "cannot import module"),
    (["worker", "q", "--handler", "tests.handlers:nothing"], 2, "no callable 'nothing'"),
    (["worker", "q", "--handler", "tests.handlers:echo", "--redis-url",
      "redis://127.0.0.1:1/0", "--redis-wait", "0.5"], 3, "cannot reach Redis"),
    (["health", "-v", "--redis-url", "redis://127.0.0.1:1/0"], 3, "cannot reach Redis"),
]


@pytest.mark.parametrize(("args", "code", "fragment"), BAD, ids=[" ".join(b[0][:3]) for b in BAD])
def test_bad_input_gives_one_line_and_its_exit_code(
    r: redis.Redis, redis_url: str, queue_name: str, args: list[str], code: int, fragment: str
) -> None:
    Queue(queue_name, redis_url).submit([1])  # a queue that exists
    res = cli(redis_url, *[queue_name if a == "KNOWN" else a for a in args])
    one_error_line(res.stderr, code, res.exit_code, fragment)


def test_bad_input_in_a_real_process(redis_url: str) -> None:
    for args, code, fragment in (BAD[0], BAD[1], BAD[2]):
        out = run(redis_url, *args)
        one_error_line(out.stderr, code, out.returncode, fragment)


# -- submit --------------------------------------------------------------------------------


def test_submit_from_arguments_stdin_and_file(
    r: redis.Redis, redis_url: str, queue_name: str, tmp_path: Path, workers: Any
) -> None:
    q = Queue(queue_name, redis_url)
    doc = cli_json(redis_url, "submit", queue_name, '{"a": 1}', "hello", "42", '"7"',
                   "--priority", "3", "--concurrency", "2", "--client", "team-a",
                   "--max-deliveries", "2", "--job-id", "job-args")
    assert doc == {"job_id": "job-args", "queue": queue_name, "created": True,
                   "sub_requests": 4}
    st = q.status("job-args")
    assert (st.priority, st.concurrency, st.client, st.total) == (3, 2, "team-a", 4)
    assert r.hget(JobKeys("job-args", queue_name).meta, "max_deliveries") == b"2"
    res = cli(redis_url, "submit", queue_name, "-", "--json", input='{"n": 1}\n\n[2]\n')
    stdin_job = json.loads(res.stdout)["job_id"]
    f = tmp_path / "in.jsonl"
    f.write_text('"x"\n{"y": [1, 2]}\n')
    file_job = cli_json(redis_url, "submit", queue_name, "--file", str(f))["job_id"]
    again = cli_json(redis_url, "submit", queue_name, "1", "--dedup-key", "k1")
    assert cli_json(redis_url, "submit", queue_name, "2", "--dedup-key", "k1") == {
        **again, "created": False}
    workers(queue_name, echo)
    for job in ("job-args", stdin_job, file_job):
        assert q.wait(job, timeout=20).state is JobState.SUCCEEDED
    assert q.results("job-args") == {0: {"a": 1}, 1: "hello", 2: 42, 3: "7"}
    assert q.results(stdin_job) == {0: {"n": 1}, 1: [2]}
    assert q.results(file_job) == {0: "x", 1: {"y": [1, 2]}}


def test_malformed_jsonl_names_the_line_and_enqueues_nothing(
    r: redis.Redis, redis_url: str, queue_name: str, tmp_path: Path
) -> None:
    before = r.dbsize()  # 0, or on the cluster the queue's stored shard count
    f = tmp_path / "bad.jsonl"
    f.write_text('{"ok": 1}\n{"ok": 2}\n{"broken": \n{"ok": 4}\n')
    res = cli(redis_url, "submit", queue_name, "--file", str(f))
    one_error_line(res.stderr, ExitCode.USAGE, res.exit_code, f"line 3 of {f}")
    out = run(redis_url, "submit", queue_name, "-", input='1\n2\nnot json\n')
    one_error_line(out.stderr, ExitCode.USAGE, out.returncode, "line 3 of stdin")
    res = cli(redis_url, "submit", queue_name, "--file", str(tmp_path / "missing.jsonl"))
    one_error_line(res.stderr, ExitCode.USAGE, res.exit_code, "cannot read")
    assert r.dbsize() == before  # nothing enqueued, not even a key


def test_a_submit_of_no_payload_is_refused(r: redis.Redis, redis_url: str,
                                           queue_name: str, tmp_path: Path) -> None:
    before = r.dbsize()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    res = cli(redis_url, "submit", queue_name, "--file", str(empty))
    one_error_line(res.stderr, ExitCode.USAGE, res.exit_code, f"{empty} has no payload")
    out = run(redis_url, "submit", queue_name, "-", input="")
    one_error_line(out.stderr, ExitCode.USAGE, out.returncode, "stdin has no payload")
    assert r.dbsize() == before


def test_an_existing_job_is_shown_with_its_own_count(redis_url: str, queue_name: str) -> None:
    first = cli(redis_url, "submit", queue_name, "1", "2", "3", "--job-id", "j-1",
                "--priority", "7")
    assert first.exit_code == 0, first.stderr
    again = cli(redis_url, "submit", queue_name, "9", "--job-id", "j-1")
    assert again.exit_code == 0
    assert again.stdout.strip() == ("already exists, nothing enqueued: job j-1 "
                                    "(3 sub-requests, priority 7)")
    doc = cli_json(redis_url, "submit", queue_name, "9", "--job-id", "j-1")
    assert (doc["created"], doc["sub_requests"]) == (False, 3)


def test_submit_in_a_real_process_reads_stdin(r: redis.Redis, redis_url: str,
                                             queue_name: str) -> None:
    out = run(redis_url, "submit", queue_name, "-", "--json", input='{"n": 1}\n{"n": 2}\n')
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)["job_id"]
    assert r.xlen(JobKeys(job, queue_name).tasks) == 2 and r.zscore(QueueKeys(queue_name).active, job)


def test_submit_wait_exits_1_when_the_job_failed(redis_url: str, queue_name: str,
                                                workers: Any) -> None:
    def handler(payload: Any) -> Any:
        if payload == "bad":
            raise NonRetryable("bad payload")
        return payload

    workers(queue_name, handler)
    doc = cli_json(redis_url, "submit", queue_name, "1", "2", "--wait", "--timeout", "20")
    assert doc["status"]["state"] == "succeeded" and doc["status"]["done"] == 2
    res = cli(redis_url, "submit", queue_name, "1", "bad", "--max-deliveries", "1", "--wait")
    assert res.exit_code == ExitCode.FAILURE, res.stderr
    assert "partial: 1 done, 1 failed of 2" in res.stdout


# -- status, pending, workers: the numbers equal Redis's own ------------------------------


def _pending_by(r: redis.Redis, queue: str, job: str) -> dict[str, int]:
    return {c["name"].decode(): c["pending"] for c in r.xpending(JobKeys(job, queue).tasks, GROUP)[
        "consumers"]}


def _idle_ids(r: redis.Redis, queue: str, jobs: list[str], min_idle_ms: int) -> set[str]:
    return {e["message_id"].decode() for j in jobs for e in r.xpending_range(
        JobKeys(j, queue).tasks, GROUP, "-", "+", 1000, idle=min_idle_ms)}


@pytest.mark.chaos
def test_status_pending_workers_with_live_stalled_and_dead_work(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    q, qk = Queue(queue_name, redis_url), QueueKeys(queue_name)
    # Given job B read by fake consumers and left pending (stalled), 2 of them delivered twice
    b = q.submit([{"sleep": 1}] * 4, priority=90).id
    read = r.xreadgroup(GROUP, "ghost", {JobKeys(b, queue_name).tasks: ">"}, count=10)
    ids = [e[0] for e in read[0][1]]
    r.xclaim(JobKeys(b, queue_name).tasks, GROUP, "ghost2", 0, ids[:2])
    # and job C dead-lettered by a worker process (KeyError, max_deliveries 1)
    c = q.submit([{"no sleep": 1}], priority=0, max_deliveries=1).id
    w1 = procs.worker(queue_name, "tests.handlers:slow", "--concurrency", "1", "--batch", "2")
    until(lambda: r.xlen(qk.dead) == 1, what="dead letter")
    # and job A in flight in that worker, which is then killed with SIGKILL
    a = q.submit([{"sleep": 30}] * 3, priority=10).id
    until(lambda: r.exists(f"started:{a}:0"), what="job A started")
    w1.send_signal(signal.SIGKILL)
    w1.wait()
    # and job D in flight in a live worker
    w2 = procs.worker(queue_name, "tests.handlers:slow", "--concurrency", "1", "--batch", "1")
    d = q.submit([{"sleep": 30}] * 2, priority=20).id
    until(lambda: r.exists(f"started:{d}:0"), what="job D started")
    until(lambda: r.zcount(qk.workers, "-inf", f"({int(time.time() * 1000)}") == 1,
          what="the killed worker's heartbeat to expire")
    time.sleep(max(0.0, 1.6 - int(r.xpending_range(JobKeys(b, queue_name).tasks, GROUP, "-", "+", 1)[0][
        "time_since_delivered"]) / 1000))
    jobs = [b, a, d]

    # When an operator asks for the overview
    ov = cli_json(redis_url, "status", queue_name)
    # Then every number is Redis's own
    assert ov["active_jobs"] == r.zcard(qk.active) == 3
    assert {j["job_id"] for j in ov["jobs"]} == set(jobs)
    assert (ov["ready"], ov["leased"], ov["parked"]) == (
        r.zcard(qk.ready), r.zcard(qk.leased), r.zcard(qk.parked))
    assert ov["dead_letters"] == r.xlen(qk.dead) == 1
    assert (ov["workers_live"], ov["workers_dead"]) == (1, 1)
    assert ov["completions_last_minute"] == r.xlen(qk.events) == 1  # job C, failed
    assert q.status(c).state is JobState.FAILED
    for row in ov["jobs"]:
        tasks = JobKeys(row["job_id"], queue_name).tasks
        pending = r.xpending(tasks, GROUP)["pending"]
        assert row["in_flight"] == pending
        assert row["queued"] == r.xlen(tasks) - pending + r.zcard(JobKeys(row["job_id"], queue_name).retry)
        assert row["consumers"] == _pending_by(r, queue_name, row["job_id"])
    assert ov["in_flight"] == 4 + 2 + 1
    assert {p["priority"]: p["jobs"] for p in ov["by_priority"]} == {10: 1, 20: 1, 90: 1}
    oldest = max(e["time_since_delivered"] for j in jobs for e in r.xpending_range(
        JobKeys(j, queue_name).tasks, GROUP, "-", "+", 100))
    assert 0 <= oldest - ov["oldest_pending_idle_ms"] < 2000
    assert cli_json(redis_url, "status", queue_name, a) == q.status(a).as_dict()
    text = cli(redis_url, "status", queue_name).stdout
    assert "active jobs 3" in text and "dead letters 1" in text

    # pending, grouped by job and consumer, equals XPENDING
    pend = cli_json(redis_url, "pending", queue_name)
    assert {(g["job_id"], g["consumer"]): g["count"] for g in pend["groups"]} == {
        (j, cons): n for j in jobs for cons, n in _pending_by(r, queue_name, j).items()}
    assert pend["total"] == sum(r.xpending(JobKeys(j, queue_name).tasks, GROUP)["pending"] for j in jobs)
    groups = {(g["job_id"], g["consumer"]): g for g in pend["groups"]}
    assert groups[(b, "ghost2")]["max_deliveries"] == 2 and groups[(b, "ghost")][
        "max_deliveries"] == 1
    assert not groups[(b, "ghost")]["consumer_live"]
    live = {g["consumer"] for g in pend["groups"] if g["consumer_live"]}
    assert live == set(_pending_by(r, queue_name, d))
    # per entry with JOB: ids, indexes, consumers and delivery counts from XPENDING / XRANGE
    entries = cli_json(redis_url, "pending", queue_name, b)["entries"]
    redis_entries = r.xpending_range(JobKeys(b, queue_name).tasks, GROUP, "-", "+", 100)
    assert [(e["entry_id"], e["consumer"], e["deliveries"]) for e in entries] == [
        (x["message_id"].decode(), x["consumer"].decode(), x["times_delivered"])
        for x in redis_entries]
    assert [e["index"] for e in entries] == [
        int(r.xrange(JobKeys(b, queue_name).tasks, e["entry_id"], e["entry_id"])[0][1][b"i"])
        for e in entries] == [0, 1, 2, 3]
    only = cli_json(redis_url, "pending", queue_name, "--consumer", "ghost2", "--details")
    assert {e["entry_id"] for e in only["entries"]} == {i.decode() for i in ids[:2]}
    # --min-idle filters as XPENDING IDLE does (idle only grows, except refreshed entries)
    before = _idle_ids(r, queue_name, jobs, 1000)
    shown = {e["entry_id"] for e in cli_json(redis_url, "pending", queue_name, "--min-idle",
                                             "1", "--details")["entries"]}
    assert before <= shown <= _idle_ids(r, queue_name, jobs, 1000)
    assert {i.decode() for i in ids} <= shown

    # workers: the killed one is dead and still owns job A's token
    rows = {w["pid"]: w for w in cli_json(redis_url, "workers", queue_name)["workers"]}
    owners = [owner_worker(v.decode()) for v in r.hvals(qk.owners)]
    dead, alive = rows[w1.pid], rows[w2.pid]
    assert not dead["alive"] and dead["deadline_in_ms"] < 0 and alive["alive"]
    assert dead["leases"] == owners.count(dead["worker_id"]) == 1
    assert alive["leases"] == owners.count(alive["worker_id"])
    assert dead["processed"] == int(r.hget(qk.worker(dead["worker_id"]), "processed") or 0)
    text = cli(redis_url, "workers", queue_name).stdout
    assert dead["worker_id"] in text and "dead" in text

    # and one dashboard frame shows the same
    frame = cli(redis_url, "watch", queue_name, "--once").stdout
    assert "active jobs 3" in frame and "dead letters 1" in frame and alive["worker_id"] in frame


# -- dead letters --------------------------------------------------------------------------


def test_dlq_list_show_replay_purge(r: redis.Redis, redis_url: str, queue_name: str,
                                    workers: Any) -> None:
    fixed = threading.Event()

    def handler(payload: Any) -> Any:
        if payload.get("bad") and not fixed.is_set():
            raise NonRetryable("cannot handle it yet")
        return payload

    q, qk = Queue(queue_name, redis_url), QueueKeys(queue_name)
    workers(queue_name, handler)
    job = q.submit([{"n": 0}, {"bad": 1}, {"bad": 2}], max_deliveries=1)
    assert job.wait(20).state is JobState.PARTIAL
    until(lambda: r.xlen(qk.dead) == 2)
    listed = cli_json(redis_url, "dlq", "list", queue_name)
    assert listed["total"] == r.xlen(qk.dead) == 2
    assert [d["id"] for d in listed["dead_letters"]] == [
        i.decode() for i, _ in r.xrevrange(qk.dead)]
    first = listed["dead_letters"][-1]
    shown = cli_json(redis_url, "dlq", "show", queue_name, first["id"])
    assert shown["payload"] == {"bad": 1} and "cannot handle it yet" in shown["error"]
    assert shown["job_id"] == job.id and shown["index"] == 1  # a number, as in `pending`
    table = cli(redis_url, "dlq", "show", queue_name, first["id"]).stdout
    assert '{"bad": 1}' in table and "{'bad'" not in table  # JSON, not a Python repr
    # replay: the job is finished, so the dead letter goes to a new job, which now succeeds
    fixed.set()
    replayed = cli_json(redis_url, "dlq", "replay", queue_name, first["id"])["replayed"]
    assert replayed[0]["id"] == first["id"] and replayed[0]["job_id"] != job.id
    assert q.wait(replayed[0]["job_id"], 20).state is JobState.SUCCEEDED
    assert r.xlen(qk.dead) == 1
    # purge asks first
    res = cli(redis_url, "dlq", "purge", queue_name, input="n\n")
    assert res.exit_code == ExitCode.FAILURE and "cancelled" in res.stderr
    assert r.xlen(qk.dead) == 1
    assert cli_json(redis_url, "dlq", "purge", queue_name, "--yes") == {
        "queue": queue_name, "purged": 1}
    assert r.xlen(qk.dead) == 0


# -- subscribe -----------------------------------------------------------------------------


def test_subscribe_until_done_sees_jobs_done_before_and_after_it_started(
    r: redis.Redis, redis_url: str, queue_name: str, procs: Procs
) -> None:
    q = Queue(queue_name, redis_url)
    # Given job A finished before the subscriber starts, and job B not started
    before = q.submit([1, 2]).id
    w = Worker(queue_name, echo, redis_url, heartbeat_s=0.3, idle_wait_s=0.1)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    assert q.wait(before, 20).state is JobState.SUCCEEDED
    w.stop()
    t.join(20)
    after = q.submit([3]).id
    env = dict(os.environ, STREAMQ_REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    sub = subprocess.Popen([sys.executable, "-m", "streamq", "subscribe", queue_name, before,
                            after, "--until-done", "--json", "--timeout", "60"], env=env,
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert sub.stdout is not None
        # When it printed A from the durable state, a worker starts and finishes B
        first = json.loads(sub.stdout.readline())
        assert (first["job_id"], first["state"]) == (before, "succeeded")
        assert q.status(after).state is JobState.ACTIVE
        procs.worker(queue_name, "tests.handlers:echo")
        out, err = sub.communicate(timeout=30)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.communicate()
    # Then B's completion came from the channel, and it exits 0
    assert sub.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(c["job_id"], c["state"], c["done"]) for c in lines] == [(after, "succeeded", 1)]


def test_subscribe_exit_codes_and_plain_stream(redis_url: str, queue_name: str,
                                               workers: Any) -> None:
    def handler(payload: Any) -> Any:
        if payload == "bad":
            raise NonRetryable("no")
        time.sleep(1.0 if payload == 2 else 0.2)
        return payload

    q = Queue(queue_name, redis_url)
    workers(queue_name, handler)
    ok, bad = q.submit([1]), q.submit(["bad"], max_deliveries=1)
    bad.wait(20)
    res = cli(redis_url, "subscribe", queue_name, bad.id, "--until-done")
    assert res.exit_code == ExitCode.FAILURE and res.stdout.startswith(f"{bad.id} failed")
    # without --until-done it prints what comes on the channel until the timeout
    slow = q.submit([2])
    res = cli(redis_url, "subscribe", queue_name, "--json", "--timeout", "3")
    assert res.exit_code == 0, res.stderr
    assert slow.id in {json.loads(line)["job_id"] for line in res.stdout.splitlines()}
    assert ok.wait(20).state is JobState.SUCCEEDED
    res = cli(redis_url, "subscribe", queue_name, ok.id, slow.id, "--until-done")
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 2


def test_subscribe_before_the_queue_was_ever_used(redis_url: str, queue_name: str,
                                                  procs: Procs) -> None:
    # Given a subscriber of a queue nothing was submitted to yet
    sub = Subscriber(redis_url, queue_name)
    try:
        # When the queue's first jobs are submitted and run
        q = Queue(queue_name, redis_url)
        jobs = [q.submit([i]) for i in range(4)]
        procs.worker(queue_name, "tests.handlers:echo")
        for j in jobs:
            assert j.wait(timeout=30).state is JobState.SUCCEEDED
        sub.wait_heard({j.id for j in jobs})
    finally:
        heard = sub.stop()
    # Then the subscriber printed each completion, one JSON object per line
    assert heard == {j.id for j in jobs}, sub.stderr


# -- watch in a real terminal --------------------------------------------------------------


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_watch_dashboard_in_tmux(r: redis.Redis, redis_url: str, queue_name: str,
                                 procs: Procs) -> None:
    q = Queue(queue_name, redis_url)
    q.submit([{"sleep": 30}])
    q.submit([{"sleep": 30}], priority=7)
    procs.worker(queue_name, "tests.handlers:slow", "--concurrency", "1")
    sock, session = f"streamq-test-{uuid.uuid4().hex[:6]}", "watch"
    tmux = ["tmux", "-L", sock]
    cmd = (f"cd {ROOT} && PYTHONPATH={ROOT} exec {sys.executable} -m streamq watch "
           f"{queue_name} --redis-url {redis_url} --interval 0.3")
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "120", "-y", "40", cmd],
                   check=True, timeout=10)

    def screen() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True,
                              text=True, timeout=10).stdout

    try:
        until(lambda: "active jobs 2" in screen() and "in flight 1" in screen(), 20,
              "the dashboard")
        text = screen()
        assert f"queue {queue_name}" in text and "backlog by priority" in text
        assert "workers 1 live" in text
        # live numbers: a new job shows up without restarting it
        q.submit([{"sleep": 30}], priority=3)
        until(lambda: "active jobs 3" in screen(), 20, "the dashboard to refresh")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=10)


# -- health, logs, pipeline -----------------------------------------------------------------


def test_health(r: redis.Redis, redis_url: str, queue_name: str, workers: Any) -> None:
    res = cli(redis_url, "health")
    assert (res.exit_code, res.stdout, res.stderr) == (0, "", "")
    res = cli(redis_url, "health", "--queue", queue_name)  # nothing of it in Redis yet
    one_error_line(res.stderr, ExitCode.NOT_FOUND, res.exit_code, "not found")
    Queue(queue_name, redis_url).submit([1])  # the queue exists, no worker serves it
    res = cli(redis_url, "health", "--queue", queue_name)  # without -v: one line says why
    assert res.stdout == ""
    one_error_line(res.stderr, ExitCode.UNHEALTHY, res.exit_code, "no live worker")
    res = cli(redis_url, "health", "--queue", queue_name, "-v")
    one_error_line(res.stderr, ExitCode.UNHEALTHY, res.exit_code, "no live worker")
    res = cli(redis_url, "health", "--queue", queue_name, "--json")
    assert json.loads(res.stdout)["live_workers"] == 0 and res.exit_code == 5
    workers(queue_name, echo)
    until(lambda: r.zcard(QueueKeys(queue_name).workers))
    doc = cli_json(redis_url, "health", "--queue", queue_name)
    assert doc["healthy"] and doc["live_workers"] == 1 and doc["exit_code"] == 0
    out = run(redis_url, "health", "--json", "--redis-url", "redis://127.0.0.1:1/0")
    assert out.returncode == 3 and json.loads(out.stdout)["healthy"] is False
    out = run(redis_url, "health", "--redis-url", "redis://127.0.0.1:1/0")
    one_error_line(out.stderr, ExitCode.REDIS_UNAVAILABLE, out.returncode, "cannot reach")


@pytest.mark.cluster_too
def test_a_bad_redis_url_is_a_usage_error_that_names_what_is_wrong(
    redis_url: str, queue_name: str, topology: str, tmp_path: Path
) -> None:
    base = redis_url.rsplit("/", 1)[0]
    for url, fragment in ((f"{base}/abc", "the database must be a number, got 'abc'"),
                          (f"{base}/0?ssl_ca_certs={tmp_path}/no-ca.crt", "no-ca.crt")):
        for args in (["health"], ["status", queue_name], ["submit", queue_name, "1"]):
            res = cli(url, *args)
            one_error_line(res.stderr, ExitCode.USAGE, res.exit_code, fragment)
    # rediss:// to a port that speaks plain Redis: one try with short timeouts, a hint
    res = cli(f"rediss://{base.removeprefix('redis://')}/0", "submit", queue_name, "1")
    one_error_line(res.stderr, ExitCode.REDIS_UNAVAILABLE, res.exit_code, "speak TLS")
    if topology == "standalone":  # a cluster has database 0 only, and says so itself
        res = cli(f"{base}/99", "submit", queue_name, "1")
        one_error_line(res.stderr, ExitCode.USAGE, res.exit_code, "no such database")
        res = cli(f"{base}/99", "health")
        one_error_line(res.stderr, ExitCode.USAGE, res.exit_code, "no such database")


def test_worker_and_reaper_log_json(r: redis.Redis, redis_url: str, queue_name: str,
                                    procs: Procs) -> None:
    Queue(queue_name, redis_url).submit([1])
    worker = procs.worker(queue_name, "tests.handlers:echo", "--log-level", "INFO",
                          "--log-format", "json")
    until(lambda: r.zcard(QueueKeys(queue_name).workers), what="worker")
    port = free_port()
    reaper = procs.reaper(queue_name, "--log-level", "INFO", "--log-format", "json",
                          "--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
    # both have logged by now: the worker registered, the reaper ran a pass
    until(lambda: (reaper_passes(port) or 0) >= 1, 60, "a reaper pass")
    for proc in (worker, reaper):
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        records = [json.loads(line) for line in err.decode().splitlines()]
        assert records and all(set(rec) >= {"ts", "level", "logger", "message"}
                               for rec in records)
        assert any(rec["logger"].startswith("streamq.") for rec in records)


def test_the_reaper_keeps_the_schedulers_lines_for_debug(redis_url: str, queue_name: str,
                                                           procs: Procs) -> None:
    Queue(queue_name, redis_url).submit([1])
    ports = [free_port(), free_port()]
    quiet = procs.reaper(queue_name, "--log-level", "INFO", "--metrics-port", str(ports[0]),
                         "--metrics-addr", "127.0.0.1")
    loud = procs.reaper(queue_name, "--log-level", "DEBUG", "--metrics-port", str(ports[1]),
                        "--metrics-addr", "127.0.0.1")
    # a few passes at --interval 0.5: 3 of each (the 2 s this used to wait, the processes'
    # start included, left fewer)
    until(lambda: all((reaper_passes(p) or 0) >= 3 for p in ports), 60, "3 passes of each")
    errs = []
    for proc in (quiet, loud):
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        errs.append(err.decode())
    assert "apscheduler" not in errs[0] and "Running job" not in errs[0], errs[0][-2000:]
    assert "Running job" in errs[1]


@pytest.mark.parametrize("hidden", ["pyspark", "streamq.spark"])
def test_pipeline_without_spark_says_what_to_install(redis_url: str, hidden: str) -> None:
    # a process where the module cannot be imported, whether or not it is installed here
    code = (f"import sys; sys.modules[{hidden!r}] = None; sys.argv[0] = 'streamq'; "
            "from streamq.cli import main; main()")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for args in (["pipeline", "run", "in.csv", "--anything"], ["pipeline"]):
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                             text=True, env=env, cwd=ROOT, timeout=60)
        one_error_line(out.stderr, ExitCode.USAGE, out.returncode, "install streamq[spark]")
    ok = subprocess.run([sys.executable, "-c", code, "status", "--help"], capture_output=True,
                        text=True, env=env, cwd=ROOT, timeout=60)
    assert ok.returncode == 0 and "QUEUE" in ok.stdout
