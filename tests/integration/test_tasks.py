"""Named tasks (streamq.Tasks) served by a real `streamq worker` process, routed by
name; and the wire format of docs/wire-format.md: a job submitted with redis-cli only
(no Python producer), run by that worker, its outcome read back with redis-cli."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until

from streamq import ConfigError, JobState, Queue
from streamq.base.keys import QueueKeys

STREAMQ = str(Path(sys.executable).with_name("streamq"))

APP = '''
from streamq import Tasks

tasks = Tasks("{queue}")


@tasks.task
def add(a, b=0):
    return {{"sum": a + b}}


@tasks.task(name="shout", priority=0)
def upper(text):
    return text.upper()


@tasks.task
async def double(x):
    return x * 2
'''


@pytest.fixture
def app(redis_url: str, queue_name: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """app.py with three tasks, a worker serving them (--handler app:tasks), and the
    module imported here as a producer imports it."""
    (tmp_path / "app.py").write_text(APP.format(queue=queue_name))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["STREAMQ_REDIS_URL"] = redis_url
    worker = subprocess.Popen([STREAMQ, "worker", queue_name, "--handler", "app:tasks",
                               "--heartbeat", "0.3"], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("STREAMQ_REDIS_URL", redis_url)
    monkeypatch.delitem(sys.modules, "app", raising=False)
    try:
        import app as module  # the test's own app.py

        yield module
    finally:
        sys.modules.pop("app", None)
        worker.kill()
        worker.communicate()


def test_one_worker_serves_several_named_tasks(app: Any, queue_name: str) -> None:
    # Given tasks registered by name, one of them async, one under another name
    assert app.tasks.names == ["add", "double", "shout"]
    # When each is sent with .delay, as a Celery or arq user would
    jobs = [app.add.delay(2, b=3), app.upper.delay("hi"), app.double.delay(21)]
    # Then the one worker routes each to its function by name
    for job in jobs:
        assert job.wait(timeout=60).state is JobState.SUCCEEDED
    assert [j.results()[0] for j in jobs] == [{"sum": 5}, "HI", 42]
    # And a task's own job options apply (shout: priority 0), a call's over them
    assert jobs[1].status().priority == 0
    assert app.add.submit([1], priority=7).status().priority == 7
    # And the function still runs as a plain call here
    assert app.add(1, 1) == {"sum": 2}


def test_an_unknown_task_or_wrong_arguments_are_dead_lettered_at_once(
        app: Any, queue_name: str) -> None:
    q = Queue(queue_name)
    # Given calls a producer elsewhere sent: an unknown name, arguments add does not take
    unknown = q.submit([{"task": "resize", "args": ["a.png"]}], max_deliveries=5)
    wrong = q.submit([{"task": "add", "args": [1, 2, 3]}], max_deliveries=5)
    # Then each is dead-lettered after one attempt, its error naming what is wrong
    for job, words in ((unknown, "unknown task 'resize': this worker serves add, double, "
                                 "shout"),
                       (wrong, "task 'add'")):
        assert job.wait(timeout=60).state is JobState.FAILED
        dead = q.dead_letters(job_id=job.id)
        assert len(dead) == 1 and dead[0].attempts == 1, dead
        assert words in dead[0].error, dead[0].error
    # And a call with arguments the function does not take is refused before sending
    before = q.dead_letters()
    with pytest.raises(ConfigError, match="task 'add'"):
        app.add.delay(1, 2, 3)
    assert q.dead_letters() == before
    q.close()


def _cli(url: str, *args: str) -> str:
    port = url.rsplit(":", 1)[1].split("/")[0]
    out = subprocess.run(["redis-cli", "-p", port, "--no-raw", *args], capture_output=True,
                         text=True, timeout=30, check=True)
    return out.stdout


def _raw(url: str, *args: str) -> str:
    port = url.rsplit(":", 1)[1].split("/")[0]
    return subprocess.run(["redis-cli", "-p", port, "--raw", *args], capture_output=True,
                          text=True, timeout=30, check=True).stdout.strip()


def test_a_job_submitted_with_redis_cli_only_runs_as_the_wire_format_says(
        app: Any, redis_url: str, queue_name: str) -> None:
    # Given the queue's shard, read as docs/wire-format.md says (one shard here)
    wait_until(lambda: _raw(redis_url, "HGET", f"sq:{{{queue_name}}}:config", "shards"),
               30, "the worker to store the queue's shards")
    tag = _raw(redis_url, "HGET", f"sq:{{{queue_name}}}:config", "shards")
    assert tag == queue_name
    qk = QueueKeys(tag)
    # When a producer with redis-cli only calls sq_lane_submit
    reply = _cli(redis_url, "FCALL", "sq_lane_submit", "5", qk.lane(50, "default"),
                 qk.lanes, qk.ljobs, qk.lactive, qk.wake, "workers", "50|default", "64",
                 "86400000", "5", "cli-job-1", "j",
                 '{"task": "add", "args": [40, 2], "kwargs": {}}')
    assert reply.splitlines()[1].endswith("(integer) 1"), reply  # submitted now
    # Then the worker runs it, and its record and result read back with redis-cli
    wait_until(lambda: _raw(redis_url, "HGET", qk.ljobs, "cli-job-1").startswith("S"), 60,
               "the job to succeed")
    head, result = _raw(redis_url, "HGET", qk.ljobs, "cli-job-1").split("\n", 1)
    assert re.fullmatch(r"S\d+\|\d+", head) and result == 'j{"sum":42}', (head, result)
    # And the Python API sees the same job
    q = Queue(queue_name)
    assert q.status("cli-job-1").state is JobState.SUCCEEDED
    assert q.results("cli-job-1") == {0: {"sum": 42}}
    # And the call sent again (a lost reply) changes nothing
    again = _cli(redis_url, "FCALL", "sq_lane_submit", "5", qk.lane(50, "default"),
                 qk.lanes, qk.ljobs, qk.lactive, qk.wake, "workers", "50|default", "64",
                 "86400000", "5", "cli-job-1", "j", '{"task": "add", "args": [0], "kwargs": {}}')
    assert again.splitlines()[1].endswith("(integer) 0"), again
    assert q.results("cli-job-1") == {0: {"sum": 42}}
    q.close()


def test_a_raw_submit_can_neither_strand_a_lane_nor_store_a_record_of_its_own(
        app: Any, redis_url: str, queue_name: str) -> None:
    # Given the queue's shard, served by the worker
    wait_until(lambda: _raw(redis_url, "HGET", f"sq:{{{queue_name}}}:config", "shards"),
               30, "the worker to store the queue's shards")
    qk = QueueKeys(_raw(redis_url, "HGET", f"sq:{{{queue_name}}}:config", "shards"))
    keys = [qk.lane(50, "default"), qk.lanes, qk.ljobs, qk.lactive, qk.wake]
    task = '{"task": "add", "args": [1, 2], "kwargs": {}}'
    # When a raw call writes into the lane of (50, default) under another lane's member
    # (workers read the lane a member names), under a priority written "050", or sends
    # its own record where the function takes an argument (the layout of a call that
    # sent records: a JSON text a status read could not parse)
    record = '{"state":"active","done":0,"failed":0}'
    forged = [("0|other", "64", "86400000", "5", "raw-1", "j", task),
              ("050|default", "64", "86400000", "5", "raw-2", "j", task),
              ("50|default", "64", '{"state":"x"}', "5", "raw-3", "j", task),
              ("0|other", "0", "64", "raw-4", record, "j", task),
              ("50|default", "50", "64", "raw-5", "{junk}", "j", task)]
    replies = [_cli(redis_url, "FCALL", "sq_lane_submit", "5", *keys, "workers", *args)
               for args in forged]
    # Then each is refused before it wrote anything: no lane, no record
    for reply in replies:
        assert "sq_lane_submit refused" in reply, reply
    assert _raw(redis_url, "EXISTS", qk.lane(50, "default")) == "0"
    assert _raw(redis_url, "ZCARD", qk.lanes) == "0" and _raw(redis_url, "HLEN", qk.ljobs) == "0"
    # And a job then submitted into that lane is served, its record the function's own
    q = Queue(queue_name)
    job = q.submit([{"task": "add", "args": [40, 2], "kwargs": {}}])
    assert job.wait(timeout=60).state is JobState.SUCCEEDED
    ok = _cli(redis_url, "FCALL", "sq_lane_submit", "5", *keys, "workers", "50|default", "64",
              "5000", "3", "raw-6", "j", task)
    assert ok.splitlines()[1].endswith("(integer) 1"), ok
    wait_until(lambda: q.status("raw-6").state is JobState.SUCCEEDED, 60, "raw-6 to succeed")
    assert q.results("raw-6") == {0: {"sum": 3}}
    q.close()
