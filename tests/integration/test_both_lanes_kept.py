"""One promise, both paths, for a job's id and its retention: a job id that names a job
already there returns that job, and a finished job is gone once its retention passed,
whether it is a small job or the same job on a stream of its own (a job id given)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import wait_until
from lanes_harness import LANES, StartWorker
from lanes_harness import submit_on as _submit

from streamq import JobNotFound, JobState, Queue
from streamq.errors import JobClosed
from streamq.storage.connection import server_ms
from streamq.web import listing


def _handler(ran: list[Any]) -> Any:
    def handle(p: Any) -> Any:
        ran.append(p["n"])
        if p.get("bad"):
            raise ValueError("bad")
        return p["n"] * 10
    return handle


def _rides(q: Queue, job_id: str) -> str:
    return "job" if q.redis.exists(q.keys.job(job_id).meta) else "small"


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.cluster_too
def test_an_id_that_names_a_job_returns_that_job_and_enqueues_nothing(
        lane: str, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    q = Queue(queue_name, redis_url)
    ran: list[Any] = []
    # Given a job waiting for a worker
    first = _submit(q, lane, [{"n": 1}], priority=7, client="acme")
    assert _rides(q, first.id) == lane
    # When a job is submitted or opened again with its id, waiting and then finished
    waiting = q.submit([{"n": 2}], job_id=first.id, priority=3)
    opened = q.open(job_id=first.id)
    workers(queue_name, _handler(ran), concurrency=1)
    assert q.wait(first.id, timeout=30).state is JobState.SUCCEEDED
    finished = q.submit([{"n": 3}], job_id=first.id)
    deduped = q.submit([{"n": 4}], job_id=first.id, dedup_key="k")
    # Then each returns the job there, created by none of them
    assert [j.id for j in (waiting, opened, finished, deduped)] == [first.id] * 4
    assert [j.created for j in (waiting, opened, finished, deduped)] == [False] * 4
    # and nothing was enqueued: the first job ran once, as it was submitted
    with pytest.raises(JobClosed):
        opened.add({"n": 5})
    opened.finalize()  # a finalize of a job finalized before changes nothing
    assert q.unfinished() == []
    st = q.status(first.id)
    assert (st.state, st.priority, st.client, st.total) == (JobState.SUCCEEDED, 7, "acme", 1)
    assert q.results(first.id) == {0: 10} and ran == [1]
    assert [c.job_id for c in q.completions(100)] == [first.id]
    q.close()


@pytest.mark.parametrize("lane", LANES)
def test_a_spark_write_into_the_id_of_a_job_there_is_refused(
        lane: str, redis_url: str, queue_name: str) -> None:
    pytest.importorskip("pyspark")
    from streamq.errors import WriteConflict
    from streamq.spark.options import SourceOptions
    from streamq.spark.writer import open_write

    q = Queue(queue_name, redis_url)
    first = _submit(q, lane, [{"n": 1}])
    with pytest.raises(WriteConflict, match="exists already"):
        open_write(SourceOptions(queue=queue_name, job=first.id, redis_url=redis_url),
                   first.id, "write-1")
    assert q.status(first.id).total == 1
    q.close()


FORMS = ["succeeded", "failed", "behind a longer retention"]


def _finished_past_retention(q: Queue, lane: str, form: str, r: Any, url: str,
                             workers: StartWorker, ran: list[Any]) -> Any:
    """A job of ``q`` (retention 1 s) finished in ``form`` (a small one kept in
    ``lkept`` with its short record or its JSON, or in ``ldone``), once its retention
    passed by Redis's clock, a worker left running idle: nothing trimmed it."""
    if form == "behind a longer retention":  # a job kept longer finished first
        longer = Queue(q.name, url, retention_s=3600)
        _submit(longer, lane, [{"n": 0}])
    job = _submit(q, lane, [{"n": 1, "bad": form == "failed"}], max_deliveries=1)
    workers(q.name, _handler(ran), concurrency=1)
    st = q.wait(job.id, timeout=30)
    assert st.state is (JobState.FAILED if form == "failed" else JobState.SUCCEEDED)
    assert st.finished_ms is not None
    if lane == "small":  # the record, and where its time is kept, as the form says
        rec = r.hget(q.keys.ljobs, job.id)
        assert rec.startswith(b"{" if form == "failed" else b"S")
        assert (r.zscore(q.keys.ldone, job.id) is not None) == (form == FORMS[2])
    wait_until(lambda: server_ms(r, q.keys.ljobs) > st.finished_ms + 1_100, 10,
               "the retention to pass")
    if lane == "small":
        assert r.hexists(q.keys.ljobs, job.id)  # not trimmed: no lane call ran since
    return job


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("lane", LANES)
@pytest.mark.cluster_too
def test_a_finished_job_is_gone_once_its_retention_passed(
        lane: str, form: str, redis_url: str, queue_name: str, workers: StartWorker,
        r: Any) -> None:
    q = Queue(queue_name, redis_url, retention_s=1)
    ran: list[Any] = []
    job = _finished_past_retention(q, lane, form, r, redis_url, workers, ran)
    # Then status, results, wait and its controls find no job
    for read in (q.status, q.results, q.wait, q.cancel, q.delete, q.retry):
        with pytest.raises(JobNotFound):
            read(job.id)
    # and the Jobs view (the dashboard's and `streamq jobs`') lists and finds nothing
    now = server_ms(r, q.keys.ljobs)
    shown = listing.page(r, q.known_shards, listing.JobFilter(), None, now).rows
    assert job.id not in [row.job_id for row in shown]
    assert listing.search(r, q.known_shards, job.id) == []
    # And its id given to a new job makes that job, which runs
    again = q.submit([{"n": 2}], job_id=job.id)
    assert again.created
    assert q.wait(job.id, timeout=30).state is JobState.SUCCEEDED
    assert q.results(job.id) == {0: 20} and ran[-1] == 2
    q.close()
