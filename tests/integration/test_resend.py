"""Producer writes under resend: a reply lost after the command ran makes the client
send it again (``connection.pipelined`` retries the whole batch); every write must
then take effect once, and the caller must still finish its two-step work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from conftest import completions_of, settled_completions
from proxy import ReplyDropProxy

from streamq import Queue, Worker
from streamq.base import codec, config
from streamq.base.keys import JobKeys, QueueKeys
from streamq.base.models import JobState

StartWorker = Callable[..., Worker]



def sha(q: Queue, script: str) -> bytes:
    return q.scripts.function(script).encode()


def test_a_resent_streaming_add_adds_once(
    r: redis.Redis, proxy: ReplyDropProxy, queue_name: str
) -> None:
    # Given a streaming job reached through a proxy that loses the add's reply once
    q = Queue(queue_name, proxy.url)
    job = q.open()
    proxy.drop_reply_to(sha(q, "add_tasks"))
    # When three sub-requests are added (the client resends after the lost reply)
    indexes = job.add_many(["a", "b", "c"])
    # Then the client resent the add on a new connection (redis-py's retry on the
    # ConnectionError the lost reply caused) and the sub-requests were added once,
    # under the indexes the first call gave
    assert proxy.dropped == 1
    assert proxy.connections == 2
    assert indexes == [0, 1, 2]
    assert job.status().total == 3
    assert r.xlen(JobKeys(job.id, queue_name).tasks) == 3
    assert int(r.hget(JobKeys(job.id, queue_name).meta, "remaining") or 0) == 4  # 3 + the open mark
    assert job.add_many(["d"]) == [3]
    q.close()


@pytest.mark.parametrize("lost", ["add_tasks", "create_job", "finalize_job", "register_jobs"])
def test_a_resent_write_of_a_big_submit_is_no_conflict(
    r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
    workers: StartWorker, lost: str,
) -> None:
    # Given a submit of more sub-requests than one create carries (fenced adds follow)
    q = Queue(queue_name, proxy.url)
    payloads = list(range(config.ADD_CHUNK * 2 + 3))
    proxy.drop_reply_to(sha(q, lost))
    # When the reply of one of its writes (the first add) is lost and the write resent
    job = q.submit(payloads)
    # Then the submit succeeds, the job is registered and holds each sub-request once
    assert proxy.dropped == 1
    assert job.created
    assert job.status().total == len(payloads)
    assert r.zscore(QueueKeys(queue_name).active, job.id) is not None
    workers(queue_name, lambda p: p, batch=100)
    assert job.wait(timeout=60).done == len(payloads)
    assert job.results() == dict(enumerate(payloads))
    assert settled_completions(r, queue_name) == {job.id: 1}
    q.close()


def test_a_second_producer_of_the_same_submit_is_still_refused(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    # Given a submit of job "big" that stopped after its first chunk
    from streamq.errors import JobConflict

    q = Queue(queue_name, redis_url)
    encoded = [codec.encode(p) for p in range(config.ADD_CHUNK * 2)]
    call = q._create_call("big", 0, 1, "c", 3, "", encoded[: config.ADD_CHUNK], "submit")
    q.scripts.run(call.name, call.keys, call.args)
    # When another producer adds the next chunk, and this one then adds the same chunk
    assert q.scripts.add_tasks(JobKeys("big", queue_name), encoded[500:600], expect_total=500) == 600
    # Then the fenced add of the first is refused: it is not a resend of its own add
    with pytest.raises(JobConflict):
        q._add_rest_and_finalize("big", encoded, 500)
    assert q.status("big").total == 600
    q.close()


def test_an_empty_job_whose_create_reply_was_lost_is_finished_once(
    r: redis.Redis, proxy: ReplyDropProxy, queue_name: str
) -> None:
    # Given an empty submit with a dedup key whose create reply is lost once
    q = Queue(queue_name, proxy.url, retention_s=60)
    qk = QueueKeys(queue_name)
    proxy.drop_reply_to(sha(q, "create_job"))
    job = q.submit([], dedup_key="empty-1")
    # Then the job was created by this call, is terminal, and finished once in its queue
    assert proxy.dropped == 1
    assert job.created
    assert job.status().state is JobState.SUCCEEDED
    assert completions_of(r, queue_name) == {job.id: 1}
    incarnation = (r.hget(JobKeys(job.id, queue_name).meta, "incarnation") or b"").decode()
    assert r.zscore(qk.finished, f"{job.id}|{incarnation}") is not None
    assert r.zscore(qk.active, job.id) is None
    # and its dedup key is forgotten after the retention, not kept for ever
    forget_at = r.zscore(qk.dedup_expiry, "empty-1")
    assert forget_at is not None and forget_at != float("inf")
    # and a second submit with the key finds it and adds no completion
    again = q.submit([1], dedup_key="empty-1")
    assert again.id == job.id and not again.created
    assert completions_of(r, queue_name) == {job.id: 1}
    q.close()


def test_a_created_job_whose_create_reply_was_lost_reports_created(
    r: redis.Redis, proxy: ReplyDropProxy, queue_name: str
) -> None:
    q = Queue(queue_name, proxy.url)
    proxy.drop_reply_to(sha(q, "create_job"))
    job = q.submit([1, 2], job_id="mine")
    assert proxy.dropped == 1
    assert job.created
    assert q.status("mine").total == 2
    assert r.hlen(QueueKeys(queue_name).tokens) == 1
    # another submit of the id (not a resend) still finds the job
    assert not q.submit([1, 2], job_id="mine").created
    proxy.drop_reply_to(sha(q, "create_job"))
    streaming = q.open(job_id="mine-2")
    assert proxy.dropped == 2
    assert streaming.created
    q.close()


@pytest.mark.parametrize("lost", ["create_job", "register_jobs", "finish_jobs"])
def test_submit_many_with_a_lost_reply_runs_each_job_once(
    r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
    workers: StartWorker, lost: str,
) -> None:
    # Given small jobs, one of them empty, submitted in one batch whose reply is lost once
    q = Queue(queue_name, proxy.url)
    payloads: list[list[Any]] = [[1, 2], [], [3], list(range(10))]
    proxy.drop_reply_to(sha(q, lost))
    jobs = q.submit_many(payloads)
    assert proxy.dropped == 1
    # Then each job holds its sub-requests once and completes once, the empty one at once
    assert [j.status().total for j in jobs] == [len(p) for p in payloads]
    assert jobs[1].status().state is JobState.SUCCEEDED
    assert completions_of(r, queue_name)[jobs[1].id] == 1
    workers(queue_name, lambda p: p * 2)
    for job, p in zip(jobs, payloads):
        assert job.wait(timeout=30).done == len(p)
        assert job.results() == {i: v * 2 for i, v in enumerate(p)}
    assert settled_completions(r, queue_name) == {j.id: 1 for j in jobs}
    assert r.hlen(QueueKeys(queue_name).tokens) == 0
    q.close()


def test_a_lost_finalize_reply_still_finishes_the_job(
    r: redis.Redis, proxy: ReplyDropProxy, queue_name: str
) -> None:
    # Given an open job with nothing added (finalizing completes it at once)
    q = Queue(queue_name, proxy.url)
    qk = QueueKeys(queue_name)
    job = q.open()
    proxy.drop_reply_to(sha(q, "finalize_job"))
    # When the finalize reply is lost and finalize is resent
    job.finalize()
    # Then the completion is recorded once in the queue, at once, with no worker or reaper
    assert proxy.dropped == 1
    assert job.status().state is JobState.SUCCEEDED
    assert completions_of(r, queue_name) == {job.id: 1}
    assert r.zscore(qk.active, job.id) is None
    assert r.hlen(qk.tokens) == 0
    # and finalizing again changes nothing
    job.finalize()
    assert completions_of(r, queue_name) == {job.id: 1}
    q.close()


def test_a_lost_finalize_reply_of_a_running_job_completes_once(
    r: redis.Redis, proxy: ReplyDropProxy, redis_url: str, queue_name: str,
    workers: StartWorker,
) -> None:
    q = Queue(queue_name, proxy.url)
    with q.open() as job:
        job.add_many(list(range(20)))
        proxy.drop_reply_to(sha(q, "finalize_job"))
    assert proxy.dropped == 1
    workers(queue_name, lambda p: p)
    assert job.wait(timeout=30).done == 20
    assert settled_completions(r, queue_name) == {job.id: 1}
    q.close()


def test_a_lost_abort_reply_still_finishes_the_job(
    r: redis.Redis, proxy: ReplyDropProxy, queue_name: str
) -> None:
    pytest.importorskip("pyspark")
    from streamq.spark.writer import abort_job

    # Given an open job with work added
    q = Queue(queue_name, proxy.url)
    job = q.open()
    job.add_many([1, 2])
    # When it is aborted and the abort's reply is lost once
    proxy.drop_reply_to(sha(q, "abort_job"))
    assert abort_job(queue_name, job.id, proxy.url, "stop")
    # Then the abort is reported as done by this call, and its completion recorded once
    assert proxy.dropped == 1
    assert job.status().state is JobState.ABORTED
    assert completions_of(r, queue_name) == {job.id: 1}
    assert r.zscore(QueueKeys(queue_name).active, job.id) is None
    assert not abort_job(queue_name, job.id, proxy.url, "again")
    q.close()


def test_a_spark_write_round_whose_reply_is_lost_adds_each_row_once(
        r: redis.Redis, proxy: ReplyDropProxy, queue_name: str) -> None:
    pa = pytest.importorskip("pyarrow")
    from streamq.spark.source import SourceOptions
    from streamq.spark.writer import StreamqWriter

    # Given a write through a proxy that loses the reply to the first add_keyed round
    # (sent without waiting: its replies are read after the next round is sent)
    writer = StreamqWriter(SourceOptions.parse({"queue": queue_name, "job": "lost-round",
                                                "redisUrl": proxy.url, "pipelineDepth": "1"}))
    proxy.drop_reply_to(sha(Queue(queue_name, proxy.url), "add_keyed"))
    rows = [{"id": i} for i in range(1_800)]
    # When a task writes 1,800 rows (four rounds of up to 500) and the driver commits
    msg = writer.write(iter([pa.RecordBatch.from_pylist(rows)]))
    writer.commit([msg])
    # Then the lost round was sent again and every row is in the job once
    assert proxy.dropped >= 1
    assert (msg.sub_requests, msg.added + msg.skipped) == (1_800, 1_800)
    st = Queue(queue_name, proxy.url).status("lost-round")
    assert (st.state, st.total) == (JobState.ACTIVE, 1_800)
    got = sorted(int(codec.decode(b"j", f[b"p"])["id"])
                 for _, f in r.xrange(JobKeys("lost-round", queue_name).tasks))
    assert got == list(range(1_800))
