"""A producer that dies between a job's create (job slot) and its register (queue
slot): the intent it sent ahead of the create lets the reaper finish the submit."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from conftest import completions_of, settled_completions
from proxy import ReplyDropProxy
from redis.backoff import NoBackoff
from redis.retry import Retry

import streamq.model.script_base
from streamq import Queue, Worker
from streamq.base.keys import JobKeys, QueueKeys
from streamq.base.models import JobState
from streamq.errors import ConnectionFailed
from streamq.reaping.reaper import Reaper
from streamq.storage import functions
from streamq.storage.connection import connect

StartWorker = Callable[..., Worker]



pytestmark = pytest.mark.cluster_too


def dying_producer(queue: str, proxy: ReplyDropProxy) -> Queue:
    """A producer whose connection breaks after the create's reply and that never
    retries: what a producer killed right after its create leaves behind."""
    q = Queue(queue, client=connect(proxy.url, retry=Retry(NoBackoff(), 0)))
    proxy.drop_reply_to(q.scripts.function("create_job").encode())
    return q


def keys_without_ttl(r: redis.Redis, queue: str, job_id: str) -> list[str]:
    return [k.decode() for k in r.scan_iter(match=f"sq:{{{queue}/{job_id}}}:*")
            if r.pttl(k) < 0]


def wait_terminal(q: Queue, job_id: str) -> JobState:
    st = q.wait(job_id, timeout=30)
    return st.state


def test_a_job_created_but_never_registered_is_registered_by_the_reaper(
    r: redis.Redis, redis_url: str, proxy: ReplyDropProxy, queue_name: str,
    workers: StartWorker,
) -> None:
    # Given a producer that dies (loses Redis for good) right after its create ran
    q = dying_producer(queue_name, proxy)
    with pytest.raises(ConnectionFailed):
        q.submit([1, 2, 3], job_id="orphan-1")
    qk = QueueKeys(queue_name)
    assert r.exists(JobKeys("orphan-1", queue_name).meta)
    assert r.zscore(qk.active, "orphan-1") is None  # created, never registered
    assert r.zscore(qk.creating, "orphan-1") is not None  # its intent is there
    # When a reaper passes (grace 0) and a worker runs
    report = Reaper(queue_name, redis_url, intent_grace_s=0).run_once()
    assert report.intents_registered == 1
    assert r.zcard(qk.creating) == 0
    workers(queue_name, lambda p: p * 10)
    # Then the job completes once, with every result, and its keys all expire
    good = Queue(queue_name, redis_url)
    assert wait_terminal(good, "orphan-1") is JobState.SUCCEEDED
    assert good.results("orphan-1") == {0: 10, 1: 20, 2: 30}
    assert settled_completions(r, queue_name) == {"orphan-1": 1}
    assert keys_without_ttl(r, queue_name, "orphan-1") == []
    good.close()


def test_an_open_job_never_registered_is_registered_by_the_reaper(
    r: redis.Redis, redis_url: str, proxy: ReplyDropProxy, queue_name: str,
    workers: StartWorker,
) -> None:
    # Given a streaming job whose producer died right after the create (with a dedup key)
    q = dying_producer(queue_name, proxy)
    with pytest.raises(ConnectionFailed):
        q.open(job_id="open-1", dedup_key="stream-a")
    qk = QueueKeys(queue_name)
    assert r.zscore(qk.active, "open-1") is None
    # When a reaper passes, then another producer adds to it and finalizes it
    report = Reaper(queue_name, redis_url, intent_grace_s=0).run_once()
    assert report.intents_registered == 1
    assert r.zscore(qk.active, "open-1") is not None
    good = Queue(queue_name, redis_url)
    job = good.open(job_id="open-1")
    assert not job.created
    job.add_many(["x", "y"])
    job.finalize()
    workers(queue_name, lambda p: p.upper())
    # Then it completes once and its dedup key is released with it
    assert wait_terminal(good, "open-1") is JobState.SUCCEEDED
    assert settled_completions(r, queue_name) == {"open-1": 1}
    deadline = time.monotonic() + 30
    while r.zscore(qk.dedup_expiry, "stream-a") == float("inf"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert keys_without_ttl(r, queue_name, "open-1") == []
    good.close()


def test_an_empty_job_created_but_never_finished_is_finished_once(
    r: redis.Redis, redis_url: str, proxy: ReplyDropProxy, queue_name: str,
) -> None:
    # Given an empty submit with a dedup key whose producer died right after the create
    # (the job is terminal in its slot, never finished in its queue)
    q = dying_producer(queue_name, proxy)
    with pytest.raises(ConnectionFailed):
        q.submit([], job_id="empty-1", dedup_key="k-empty")
    qk = QueueKeys(queue_name)
    assert r.hget(JobKeys("empty-1", queue_name).meta, "state") == b"succeeded"
    assert completions_of(r, queue_name) == {}
    # When reapers pass (twice)
    reaper = Reaper(queue_name, redis_url, intent_grace_s=0)
    assert reaper.run_once().intents_finished == 1
    assert reaper.run_once().intents_finished == 0
    # Then the job was finished once, its dedup key forgotten after the retention,
    # its keys all expire and no intent is left
    assert completions_of(r, queue_name) == {"empty-1": 1}
    forget_at = r.zscore(qk.dedup_expiry, "k-empty")
    assert forget_at is not None and forget_at != float("inf")
    assert r.zcard(qk.creating) == 0
    assert keys_without_ttl(r, queue_name, "empty-1") == []


def test_an_intent_whose_create_never_ran_is_dropped_and_frees_its_dedup_key(
    r: redis.Redis, redis_url: str, queue_name: str, workers: StartWorker,
) -> None:
    # Given a producer that reserved a dedup key (its intent written with it) and
    # died before its create ran, and one that died before a plain create ran
    q = Queue(queue_name, redis_url)
    qk = QueueKeys(queue_name)
    assert q.scripts.reserve_dedup(qk, "k-1", "never-1") == "never-1"
    call = q.scripts.intend_jobs_call(qk, ["never-2"])
    q.scripts.run(call.name, call.keys, call.args)
    assert r.zcard(qk.creating) == 2
    # When a reaper passes
    report = Reaper(queue_name, redis_url, intent_grace_s=0).run_once()
    # Then both intents are dropped, no job was made, and the key is free again:
    # a new submit with it makes a new job, which completes
    assert report.intents_dropped == 2
    assert r.zcard(qk.creating) == 0
    assert not r.exists(JobKeys("never-1", queue_name).meta) and not r.exists(JobKeys("never-2", queue_name).meta)
    assert r.hget(qk.dedup, "k-1") is None
    job = q.submit([5], dedup_key="k-1")
    assert job.created and job.id != "never-1"
    workers(queue_name, lambda p: p + 1)
    assert wait_terminal(q, job.id) is JobState.SUCCEEDED
    q.close()


def test_the_intent_costs_no_round_trip_of_its_own(
    r: redis.Redis, redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch,
    topology: str,
) -> None:
    # (the job lane: one-entry jobs would ride the small-job lane, without tokens)
    monkeypatch.setenv("STREAMQ_LANE", "0")
    # Given every script in the server's cache and a count of round trips
    functions.load(r)
    sent: list[list[bytes]] = []
    real = streamq.model.script_base.pipelined

    def counting(client: Any, commands: Any) -> Any:
        sent.append([c[1] if c[0] == "FCALL" else c[0] for c in commands])
        return real(client, commands)

    monkeypatch.setattr(streamq.model.script_base, "pipelined", counting)
    q = Queue(queue_name, redis_url)
    qk = QueueKeys(queue_name)
    sha = {name: q.scripts.function(name) for name in ("intend_jobs", "create_job",
                                                          "register_jobs", "reserve_dedup")}
    # When jobs are submitted and opened
    # Then a submit is one round trip carrying the intent and the create, then the
    # register (a dedup key's reservation carries the intent instead); the register
    # leaves no intent behind. On a cluster the intent is a round trip of its own,
    # acknowledged before the create is sent (the parts of one batch on two masters
    # run in no set order)
    def intent_then(*creates: str) -> list[list[str]]:
        if topology == "cluster":
            return [[sha["intend_jobs"]], list(creates)]
        return [[sha["intend_jobs"], *creates]]

    q.submit([1, 2])
    assert sent == [*intent_then(sha["create_job"]), [sha["register_jobs"]]]
    sent.clear()
    q.submit([1], dedup_key="d-1")
    assert sent == [[sha["reserve_dedup"]], [sha["create_job"]], [sha["register_jobs"]]]
    sent.clear()
    q.open()
    assert sent == [*intent_then(sha["create_job"]), [sha["register_jobs"]]]
    sent.clear()
    q.submit_many([[1], [2], [3]])
    assert sent == [*intent_then(*[sha["create_job"]] * 3), [sha["register_jobs"]]]
    assert r.zcard(qk.creating) == 0
    q.close()
