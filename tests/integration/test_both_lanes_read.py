"""One promise, both paths, for what reads a finished job from outside the Queue client:
the Spark source (a job's settled sub-requests as DataFrame rows, in batch and as a
stream) and the reaper's report of a pass (the jobs it finished, its active-jobs gauge),
for a small job and the same job forced onto the job lane (a job id of its own)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from conftest import Procs, wait_until
from lanes_harness import LANES, StartWorker
from lanes_harness import submit_on as _submit

from streamq import JobNotFound, JobState, Queue

#: what each handler outcome reads back as in Spark: (status, result JSON, error)
OUTCOMES: dict[str, tuple[str, str | None, str | None]] = {
    "json": ("done", '{"a":1}', None),
    "none": ("done", "null", None),
    "str": ("done", '"x\\u00e9"', None),
    "bytes": ("done", '"AP8="', None),
    "failed": ("failed", None, "ValueError: bad"),
}


def _outcome(p: Any) -> Any:
    if p["k"] == "failed":
        raise ValueError("bad")
    return {"json": {"a": 1}, "none": None, "str": "x\u00e9", "bytes": b"\x00\xff"}[p["k"]]


def _spark_rows(url: str, queue: str, job_id: str) -> dict[str, Any]:
    """What the Spark source reads of a job, as Spark calls it (no session: the
    reader's calls run as they do on the driver and in the tasks): the batch read's
    rows, and the rows of a stream read from its first offset to its latest."""
    from streamq.spark.options import SourceOptions
    from streamq.spark.reader import StreamqReader, StreamqStreamReader

    opts = SourceOptions.parse({"queue": queue, "job": job_id, "redisUrl": url})
    batch = StreamqReader(opts)
    rows = [row for part in batch.partitions() for b in batch.read(part)
            for row in b.to_pylist()]
    stream = StreamqStreamReader(opts)
    try:
        start = stream.initialOffset()
        end = stream.latestOffset(start)
        streamed = [row for part in stream.partitions(start, end) for b in stream.read(part)
                    for row in b.to_pylist()]
    finally:
        stream.stop()
    return {"batch": rows, "stream": streamed, "offset": end}


@pytest.mark.parametrize("lane", LANES)
def test_a_finished_job_reads_into_spark_rows_the_same_on_both_lanes(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    pytest.importorskip("pyspark")
    # Given one-entry jobs that returned a JSON value, None, a str, bytes, and one
    # that failed for good
    q = Queue(queue_name, redis_url)
    workers(queue_name, _outcome, concurrency=1, retry_base_s=0.01)
    jobs = {k: _submit(q, lane, [{"k": k}], max_deliveries=1) for k in OUTCOMES}
    for job in jobs.values():
        assert q.wait(job.id, timeout=30).state in (JobState.SUCCEEDED, JobState.FAILED)
    # When each is read through the Spark source, in batch and as a stream
    # Then each reads back as one row of index 0, as its outcome says, on both lanes
    for k, (status, result, error) in OUTCOMES.items():
        row = {"id": None, "index": 0, "status": status, "result": result, "error": error}
        assert _spark_rows(redis_url, queue_name, jobs[k].id) == {
            "batch": [row], "stream": [row], "offset": {"settled": 1}}, k
    # And a job that does not exist is not found, as before
    with pytest.raises(JobNotFound):
        _spark_rows(redis_url, queue_name, "no-such-job")
    q.close()


@pytest.mark.parametrize("lane", LANES)
def test_a_running_job_reads_no_spark_row_until_it_settles_on_both_lanes(
        lane: str, redis_url: str, queue_name: str) -> None:
    pytest.importorskip("pyspark")
    # Given a one-entry job no worker ran yet
    q = Queue(queue_name, redis_url)
    job = _submit(q, lane, [{"k": "json"}])
    # When it is read through the Spark source
    # Then it reads no row, and a stream's offset stays at its start
    assert _spark_rows(redis_url, queue_name, job.id) == {
        "batch": [], "stream": [], "offset": {"settled": 0}}
    q.close()


def _stalled(q: Queue, lane: str, procs: Procs, reaper: Any, stalls: int) -> str:
    """A job of one delivery whose worker process is SIGKILLed by its pid inside the
    handler ``stalls`` times, a replacement started after each kill but the last, and
    ``reaper`` passing until the replacement started it (a read not started counts no
    attempt: the second start counts the first)."""
    job = _submit(q, lane, [{"n": 4, "stalls": stalls}], max_deliveries=1)

    def started(n: int) -> bool:
        if int(q.redis.get(f"started:{job.id}:0") or 0) == n:
            return True
        if n > 1:
            reaper.run_once()  # hands the killed worker's entry on
        return False

    for n in range(1, stalls + 1):
        worker = procs.worker(q.name, "tests.handlers:stall_first", "--concurrency", "1")
        wait_until(lambda n=n: started(n), 60, f"the handler's start {n}")
        os.kill(worker.pid, signal.SIGKILL)
        assert worker.wait(30) == -signal.SIGKILL
    return job.id


@pytest.mark.parametrize("lane", LANES)
def test_a_reaper_pass_that_dead_letters_a_job_counts_it_finished_on_both_lanes(
        lane: str, redis_url: str, queue_name: str, procs: Procs) -> None:
    from streamq.reaping.reaper import Reaper

    # Given a job of one delivery whose worker was killed inside its handler twice
    # (the second start counts its one attempt), nothing else in the queue
    q = Queue(queue_name, redis_url)
    reaper = Reaper(queue_name, redis_url, min_idle_s=0.5)
    job_id = _stalled(q, lane, procs, reaper, stalls=2)
    # When a reaper pass dead-letters it (its job fails)
    report = wait_until(lambda: (lambda rep: rep if rep.dead_lettered else None)(
        reaper.run_once()), 30, "a pass to dead-letter it")
    # Then the pass reports the job finished, and its gauge of active jobs counts none
    assert q.status(job_id).state is JobState.FAILED
    assert (report.dead_lettered, report.finished) == (1, 1)
    assert "1 jobs finished" in report.summary()
    assert reaper.metrics.registry.get_sample_value(
        "streamq_active_jobs", {"queue": queue_name}) == 0
    q.close()
