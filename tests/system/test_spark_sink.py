"""The streaming sink: a streaming query (its own process, tests/spark_stream_query.py)
writes a job per micro-batch; killed with SIGKILL mid-batch and restarted from its
checkpoint, it submits each batch once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from streamq import JobState, Queue
from streamq.base.keys import JobKeys
from streamq.spark import finalize_job

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
FILES, ROWS_PER_FILE, BATCHES = 8, 1_000, 4
ROWS_PER_BATCH = 2 * ROWS_PER_FILE


def start_query(url: str, queue: str, src: Path, checkpoint: Path, *flags: str,
                log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "spark_stream_query.py"), url, queue,
             str(src), str(checkpoint), *flags],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the query's process group: the driver, its JVM and its Python workers."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def rows_of(r: redis.Redis, queue: str, job: str) -> list[int]:
    return [json.loads(f[b"p"])["id"] for _, f in r.xrange(JobKeys(job, queue).tasks)]


def input_files(src: Path) -> None:
    """Eight JSON files of 1,000 rows (ids 0..7,999), two per micro-batch."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java: no `java` on PATH and JAVA_HOME unset")
    src.mkdir()
    for f in range(FILES):
        lines = [json.dumps({"id": f * ROWS_PER_FILE + i, "name": f"n{i}"})
                 for i in range(ROWS_PER_FILE)]
        path = src / f"part-{f}.json"
        path.write_text("\n".join(lines) + "\n")
        # a second apart: the file source takes files in modification-time order, and
        # files written within one clock tick would tie
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))


def kill_in_third_batch(r: redis.Redis, proc: subprocess.Popen[bytes], pattern: str,
                        log: Path, least: int) -> str:
    """Wait until a job matching ``pattern`` is open with at least ``least`` sub-requests
    (the stalled third batch adding), SIGKILL the query; return the job id."""
    try:
        started, victim, seen = time.monotonic(), None, {}
        while time.monotonic() < started + 360 and victim is None and proc.poll() is None:
            for key in r.scan_iter("sq:{*}:meta"):
                meta = r.hgetall(key)
                seen[key.decode()] = (meta.get(b"state"), meta.get(b"total"))
            for key in r.scan_iter(pattern):
                meta = r.hgetall(key)
                if meta.get(b"state") == b"open" and int(meta.get(b"total", 0)) >= least:
                    victim = key.decode()[4:-6].partition("/")[2]
            time.sleep(0.05)
        assert victim is not None, (f"after {time.monotonic() - started:.0f} s, exit "
                                    f"{proc.poll()}, jobs {seen}\n{log.read_text()[-3000:]}")
        kill(proc)
    finally:
        if proc.poll() is None:
            kill(proc)
    return victim


def forget_last_commit(checkpoint: Path) -> None:
    """The query died after the sink committed its last batch, before Spark recorded it."""
    for name in (str(BATCHES - 1), f".{BATCHES - 1}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)


@pytest.mark.timeout(900)
def test_query_killed_mid_batch_and_restarted_submits_each_batch_once(
        tmp_path: Path, r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given eight input files, two per micro-batch
    src, checkpoint, log = tmp_path / "in", tmp_path / "ck", tmp_path / "query.log"
    input_files(src)
    # When the query is SIGKILLed while its third batch is being added
    proc = start_query(redis_url, queue_name, src, checkpoint, "--stall", log=log)
    victim = kill_in_third_batch(r, proc, f"sq:{{{queue_name}/*-2}}:meta", log, 500)
    partial = Queue(queue_name, redis_url).status(victim)
    assert partial.state is JobState.OPEN and 0 < partial.total < ROWS_PER_BATCH
    # and started again from its checkpoint until it has read every file
    proc = start_query(redis_url, queue_name, src, checkpoint, log=log)
    assert proc.wait(240) == 0, log.read_text()[-3000:]
    # Then each batch is one committed job named by the query id and batch id,
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    jobs = [f"{query_id}-{b}" for b in range(BATCHES)]
    assert victim == jobs[2]
    q = Queue(queue_name, redis_url)
    for job in jobs:
        st = q.status(job)
        assert (st.state, st.total) == (JobState.ACTIVE, ROWS_PER_BATCH), job
    # and every row was submitted exactly once, in its file's batch
    seen = Counter(i for job in jobs for i in rows_of(r, queue_name, job))
    assert sorted(seen) == list(range(FILES * ROWS_PER_FILE))
    assert set(seen.values()) == {1}
    for b, job in enumerate(jobs):
        assert {i // ROWS_PER_BATCH for i in rows_of(r, queue_name, job)} == {b}
    # When the query dies after the sink committed its last batch but before Spark
    # recorded the commit (simulated by removing that record), and starts again
    forget_last_commit(checkpoint)
    proc = start_query(redis_url, queue_name, src, checkpoint, log=log)
    assert proc.wait(240) == 0, log.read_text()[-3000:]
    # Then the batch ran again and added nothing: the job was found committed
    assert len(rows_of(r, queue_name, jobs[-1])) == ROWS_PER_BATCH
    assert q.status(jobs[-1]).total == ROWS_PER_BATCH
    assert not r.exists(JobKeys(f"{query_id}-{BATCHES}", queue_name).meta)


@pytest.mark.timeout(900)
def test_one_long_job_query_killed_and_restarted_adds_each_row_once(
        tmp_path: Path, r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given eight input files and a query adding every micro-batch to the one job "feed"
    src, checkpoint, log = tmp_path / "in", tmp_path / "ck", tmp_path / "query.log"
    input_files(src)
    one = ("--one-job", "feed")
    # When it is SIGKILLed in its third batch (two batches committed, 4,000 rows)
    proc = start_query(redis_url, queue_name, src, checkpoint, "--stall", *one, log=log)
    assert kill_in_third_batch(r, proc, f"sq:{{{queue_name}/feed}}:meta", log, 4_500) == "feed"
    assert r.hget(JobKeys("feed", queue_name).meta, "stream_batch") == b"1"
    # and started again from its checkpoint, then again after losing its last commit record
    for run in range(2):
        if run:
            forget_last_commit(checkpoint)
        proc = start_query(redis_url, queue_name, src, checkpoint, *one, log=log)
        assert proc.wait(240) == 0, log.read_text()[-3000:]
        # Then the job is still open and holds every row once, under its batch's prefix
        q = Queue(queue_name, redis_url)
        st = q.status("feed")
        assert (st.state, st.total) == (JobState.OPEN, FILES * ROWS_PER_FILE)
        assert r.hget(JobKeys("feed", queue_name).meta, "stream_batch") == str(BATCHES - 1).encode()
        assert sorted(rows_of(r, queue_name, "feed")) == list(range(FILES * ROWS_PER_FILE))
        by_batch = Counter(k.decode().split("/")[0] for k in r.hkeys(JobKeys("feed", queue_name).added))
        assert by_batch == {str(b): ROWS_PER_BATCH for b in range(BATCHES)}
    # When the query is retired and the job finalized, it completes like any job
    finalize_job(queue_name, "feed", redis_url)
    assert Queue(queue_name, redis_url).status("feed").state is JobState.ACTIVE
