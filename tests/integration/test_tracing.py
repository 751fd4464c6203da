"""OpenTelemetry tracing (streamq.tracing): spans of a submit and of each sub-request's
wait, handler run and ack in the submitter's trace; nothing when tracing is off.

The spans go to the SDK's in-memory exporter of a provider given to the Queue and the
Worker (``tracing=provider``), so the process's global provider stays unset and other
tests run untraced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from conftest import ROOT

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from streamq import JobState, Queue, Worker, current_task  # noqa: E402
from streamq.base.config import GROUP  # noqa: E402
from streamq.base.keys import JobKeys, QueueKeys  # noqa: E402
from streamq.base.running import current as entries_current  # noqa: E402
from streamq.errors import ConfigError  # noqa: E402
from streamq.services import tracing as sq_tracing  # noqa: E402

StartWorker = Callable[..., Worker]


@pytest.fixture
def otel() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


@pytest.fixture
def queues() -> Iterator[Callable[[Queue], Queue]]:
    """Close the queues a test opens at its end."""
    opened: list[Queue] = []

    def keep(q: Queue) -> Queue:
        opened.append(q)
        return q

    yield keep
    for q in opened:
        q.close()


def spans_until(exporter: InMemorySpanExporter, check: Callable[[list[ReadableSpan]], bool],
                timeout: float = 15) -> list[ReadableSpan]:
    deadline = time.monotonic() + timeout
    while True:
        spans = list(exporter.get_finished_spans())
        if check(spans):
            return spans
        assert time.monotonic() < deadline, [(s.name, dict(s.attributes or {})) for s in spans]
        time.sleep(0.05)


def named(spans: list[ReadableSpan], name: str, **attrs: Any) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name
            and all((s.attributes or {}).get(f"streamq.{k}") == v for k, v in attrs.items())]


def worker_spans_of(spans: list[ReadableSpan], index: int, attempt: int = 1
                    ) -> tuple[ReadableSpan, ReadableSpan, ReadableSpan | None]:
    wait = named(spans, "streamq.wait", index=index, attempt=attempt)
    run = named(spans, "streamq.handler", index=index, attempt=attempt)
    ack = named(spans, "streamq.ack", index=index, attempt=attempt)
    assert len(wait) == 1 and len(run) == 1 and len(ack) <= 1, (wait, run, ack)
    return wait[0], run[0], ack[0] if ack else None


@pytest.mark.parametrize("size", [1, 3], ids=["lane", "job"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_submit_wait_handler_and_ack_spans_share_the_submitters_trace(
    redis_url: str, queue_name: str, workers: StartWorker, otel: Any, size: int, kind: str,
    queues: Callable[[Queue], Queue],
) -> None:
    provider, exporter = otel
    inner: list[Any] = []

    def handler(p: int) -> int:
        # the handler span is current while the handler runs: its own spans nest in it
        with trace.get_tracer("app", tracer_provider=provider).start_as_current_span("app.work"):
            inner.append(current_task())
        return p * 2

    async def ahandler(p: int) -> int:
        return handler(p)

    w = workers(queue_name, handler if kind == "sync" else ahandler, tracing=provider)
    app = trace.get_tracer("app", tracer_provider=provider)
    q = queues(Queue(queue_name, redis_url, tracing=provider))
    with app.start_as_current_span("app.request") as request:
        job = q.submit(list(range(size)))
    assert job.wait(timeout=20).state == JobState.SUCCEEDED
    assert job.results() == {i: i * 2 for i in range(size)}
    spans = spans_until(exporter, lambda s: len(named(s, "streamq.ack")) == size)

    submit, = named(spans, "streamq.submit")
    assert submit.kind == SpanKind.PRODUCER
    assert submit.parent is not None and submit.parent.span_id == request.get_span_context().span_id
    assert (submit.attributes or {})["streamq.job_id"] == job.id
    tid = submit.context.trace_id
    for i in range(size):
        wait, run, ack = worker_spans_of(spans, i)
        assert ack is not None
        for s in (wait, run, ack):
            assert s.context.trace_id == tid
            assert s.parent is not None and s.parent.span_id == submit.context.span_id
            attrs = s.attributes or {}
            assert attrs["streamq.queue"] == queue_name and attrs["streamq.job_id"] == job.id
            assert attrs["streamq.worker_id"] == w.id and attrs["streamq.attempt"] == 1
        assert run.kind == SpanKind.CONSUMER and run.status.status_code != StatusCode.ERROR
        # queue time from the enqueue, then the run, then the ack, in order
        assert wait.start_time is not None and wait.end_time is not None
        assert submit.start_time is not None and run.end_time is not None
        assert wait.start_time >= submit.start_time // 1_000_000 * 1_000_000 - 10**9
        assert wait.end_time == run.start_time
        assert ack.start_time == run.end_time
        app_span, = [s for s in named(spans, "app.work")
                     if s.parent is not None and s.parent.span_id == run.context.span_id]
        assert app_span.context.trace_id == tid
    assert len(inner) == size


@pytest.mark.parametrize("size", [1, 2], ids=["lane", "job"])
def test_a_retry_stays_in_the_trace_with_its_attempt_and_the_failure_is_recorded(
    redis_url: str, queue_name: str, workers: StartWorker, otel: Any, size: int,
    queues: Callable[[Queue], Queue],
) -> None:
    provider, exporter = otel
    seen: set[int] = set()

    def flaky(p: int) -> int:
        if p not in seen:
            seen.add(p)
            raise ValueError(f"first try of {p}")
        return p

    workers(queue_name, flaky, tracing=provider, retry_base_s=0.05)
    q = queues(Queue(queue_name, redis_url, tracing=provider))
    job = q.submit(list(range(size)), max_deliveries=3)
    assert job.wait(timeout=30).state == JobState.SUCCEEDED
    spans = spans_until(exporter, lambda s: len(named(s, "streamq.ack")) == size)
    submit, = named(spans, "streamq.submit")
    for i in range(size):
        _, failed, no_ack = worker_spans_of(spans, i, attempt=1)
        assert no_ack is None
        assert failed.status.status_code == StatusCode.ERROR
        assert "ValueError" in (failed.status.description or "")
        assert [e.name for e in failed.events] == ["exception"]
        wait, run, ack = worker_spans_of(spans, i, attempt=2)
        assert ack is not None and run.status.status_code != StatusCode.ERROR
        for s in (failed, wait, run, ack):
            assert s.context.trace_id == submit.context.trace_id
            assert s.parent is not None and s.parent.span_id == submit.context.span_id


def test_streaming_adds_and_submit_many_carry_their_own_spans(
    redis_url: str, queue_name: str, workers: StartWorker, otel: Any
) -> None:
    provider, exporter = otel
    workers(queue_name, lambda p: p, tracing=provider)
    with Queue(queue_name, redis_url, tracing=provider) as q:
        with q.open() as sj:
            sj.add(1)
            sj.add_many([2, 3])
        many = q.submit_many([[4], [5, 6]])
        for j in [sj, *many]:
            assert q.wait(j.id, timeout=20).state == JobState.SUCCEEDED
    spans = spans_until(exporter, lambda s: len(named(s, "streamq.ack")) == 6)
    adds = named(spans, "streamq.submit", operation="add")
    assert len(adds) == 2 and all((s.attributes or {})["streamq.job_id"] == sj.id for s in adds)
    batch, = named(spans, "streamq.submit", operation="submit_many")
    assert (batch.attributes or {})["streamq.count"] == 2
    by_trace = {s.context.span_id: s for s in [*adds, batch]}
    for run in named(spans, "streamq.handler"):
        assert run.parent is not None and run.parent.span_id in by_trace
    # the streaming job's three sub-requests: the first add's one, the second's two
    runs = named(spans, "streamq.handler", job_id=sj.id)
    assert sorted(len([r for r in runs if r.parent and r.parent.span_id == a.context.span_id])
                  for a in adds) == [1, 2]


def test_entries_of_two_streams_with_one_id_keep_their_own_spans(otel: Any) -> None:
    # Given a big job's entry and a small job's lane entry that got the same id (an id
    # is unique within its stream only: both were added in the same millisecond), each
    # carrying its own submitter's context
    provider, exporter = otel
    tracer = sq_tracing.WorkerTracer("w-1", provider)
    handler = tracer.wrap(lambda p: p)
    eid = "1700000000000-0"
    contexts = {"big": "00-" + "a" * 32 + "-" + "1" * 16 + "-01",
                "small": "00-" + "b" * 32 + "-" + "2" * 16 + "-01"}
    tracer.note([("big", eid), ("small", eid)],
                [[b"i", b"0", b"t", b"j", b"p", b"1", b"c", contexts["big"].encode()],
                 [b"j", b"small", b"t", b"j", b"p", b"2", b"c", contexts["small"].encode()]])
    # When both run before either is acknowledged, then both are acknowledged
    for job in ("big", "small"):
        token = entries_current.set(("q", job, 0, eid, 1))
        try:
            handler(1)
        finally:
            entries_current.reset(token)
    tracer.acked([("big", eid), ("small", eid)])
    # Then each has its handler and ack span, in its own submitter's trace
    spans = list(exporter.get_finished_spans())
    for job, ctx in contexts.items():
        trace_id = int(ctx.split("-")[1], 16)
        for name in ("streamq.handler", "streamq.ack"):
            got, = named(spans, name, job_id=job)
            assert got.context.trace_id == trace_id


def test_tracing_off_writes_no_context_and_makes_no_span(
    redis_url: str, queue_name: str, r: redis.Redis, workers: StartWorker, otel: Any,
    monkeypatch: pytest.MonkeyPatch, queues: Callable[[Queue], Queue],
) -> None:
    provider, exporter = otel
    # another queue of the process traces (the module's switch is on), and a span of the
    # application is current: a Queue with tracing off still writes no context
    Queue(queue_name, redis_url, tracing=provider).close()
    assert sq_tracing.ACTIVE
    monkeypatch.setenv("STREAMQ_LANE", "0")
    q = queues(Queue(queue_name, redis_url, tracing=False))
    with trace.get_tracer("app", tracer_provider=provider).start_as_current_span("app"):
        assert q.tracer is None
        job = q.submit([1, 2])
        small = q.submit_many([[3]])[0]
    for jid in (job.id, small.id):
        entries = r.xrange(JobKeys(jid, queue_name).tasks)
        assert entries and all(set(f) == {b"i", b"t", b"p"} for _, f in entries)
    exporter.clear()
    w = workers(queue_name, lambda p: p, tracing=False)
    assert w.tracer is None
    assert job.wait(timeout=20).state == JobState.SUCCEEDED
    assert small.wait(timeout=20).state == JobState.SUCCEEDED
    time.sleep(0.3)
    assert exporter.get_finished_spans() == ()


def test_lane_entries_carry_the_context_only_when_traced(
    redis_url: str, queue_name: str, r: redis.Redis, otel: Any
) -> None:
    provider, _ = otel
    with Queue(queue_name, redis_url, tracing=provider) as traced, \
            Queue(queue_name, redis_url, tracing=False) as plain:
        traced.submit(["a"], priority=0, client="c")
        plain.submit(["b"], priority=0, client="c")
    fields = [f for _, f in r.xrange(QueueKeys(queue_name).lane(0, "c"))]
    assert sorted(f[b"p"] for f in fields) == [b"a", b"b"]
    carried = {f[b"p"]: f.get(sq_tracing.FIELD) for f in fields}
    assert carried[b"b"] is None
    assert carried[b"a"] is not None and carried[b"a"].startswith(b"00-")


def test_the_default_is_off_without_a_provider_and_an_explicit_ask_needs_the_extra(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, queue_name: str
) -> None:
    monkeypatch.delenv("STREAMQ_TRACING", raising=False)
    # no tracer provider set (the default proxy): off
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert sq_tracing.wanted(None) is False
    with Queue(queue_name, redis_url) as q:
        assert q.tracer is None
    w = Worker(queue_name, lambda p: p, redis_url)
    assert w.tracer is None
    w.redis.close()
    # a provider set: on; STREAMQ_TRACING=0 turns it off again
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", TracerProvider())
    assert sq_tracing.wanted(None) is True
    monkeypatch.setenv("STREAMQ_TRACING", "0")
    assert sq_tracing.wanted(None) is False
    monkeypatch.setenv("STREAMQ_TRACING", "maybe")
    with pytest.raises(ConfigError, match="STREAMQ_TRACING"):
        sq_tracing.wanted(None)
    # OpenTelemetry not importable: the default is off, asking for it is a clear error
    monkeypatch.delenv("STREAMQ_TRACING")
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # type: ignore[arg-type]
    assert sq_tracing.wanted(None) is False
    with pytest.raises(ConfigError, match=r"streamq\[otel\]"):
        sq_tracing.wanted(True)


_NO_OTEL = ("import sys, runpy; sys.modules['opentelemetry'] = None; "
            "runpy.run_module('streamq', run_name='__main__', alter_sys=True)")


def _streamq(redis_url: str, *args: str, otel: bool = True, **env: str
             ) -> subprocess.Popen[str]:
    """``streamq ARGS`` in a process of its own; with ``otel`` False, OpenTelemetry
    cannot be imported in it (as without the extra)."""
    full = dict(os.environ, STREAMQ_REDIS_URL=redis_url,
                PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}", **env)
    head = ["-m", "streamq"] if otel else ["-c", _NO_OTEL]
    return subprocess.Popen([sys.executable, *head, *args], env=full, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_cli_runs_without_the_extra(redis_url: str, queue_name: str) -> None:
    proc = _streamq(redis_url, "submit", queue_name, "--json", "1", "2", otel=False)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    worker = _streamq(redis_url, "worker", queue_name, "--handler", "handlers:echo",
                      "--log-level", "WARNING", otel=False)
    try:
        with Queue(queue_name, redis_url, tracing=False) as q:
            job = q.submit([5, 6])
            assert job.wait(timeout=30).state == JobState.SUCCEEDED
            assert job.results() == {0: 5, 1: 6}
    finally:
        worker.terminate()
        worker.communicate(timeout=30)
    # asked for without the extra: one line, exit code 2
    refused = _streamq(redis_url, "worker", queue_name, "--handler", "handlers:echo",
                       otel=False, STREAMQ_TRACING="1")
    out, err = refused.communicate(timeout=60)
    assert refused.returncode == 2, err
    assert "streamq[otel]" in err and "Traceback" not in err


def test_reclaimed_and_scheduled_entries_keep_the_context(
    redis_url: str, queue_name: str, r: redis.Redis, workers: StartWorker, otel: Any,
    queues: Callable[[Queue], Queue],
) -> None:
    provider, exporter = otel
    q = queues(Queue(queue_name, redis_url, tracing=provider))
    # an entry read by a worker that died: the reclaim re-adds it with its context
    job = q.submit([1, 2])
    jk = JobKeys(job.id, queue_name)
    r.xreadgroup(GROUP, "ghost", {jk.tasks: ">"}, count=1)
    _, readded, _, _ = q.scripts.reclaim(jk, consumer="reaper", min_idle_ms=0, cursor="0-0",
                                         count=10)
    assert readded == 1
    entries = [f for _, f in r.xrange(jk.tasks)]
    assert [f[b"i"] for f in entries] == [b"1", b"0"]
    assert entries[1][b"s"] == b"1" and entries[0][sq_tracing.FIELD] == entries[1][
        sq_tracing.FIELD]
    # a scheduled job's sub-requests wait in its retry set with the context
    later = q.submit([3], delay=0.5)
    assert r.xlen(JobKeys(later.id, queue_name).tasks) == 0
    workers(queue_name, lambda p: p, tracing=provider)
    for j in (job, later):
        assert j.wait(timeout=20).state == JobState.SUCCEEDED
    spans = spans_until(exporter, lambda s: len(named(s, "streamq.ack")) == 3)
    submits = {s.context.span_id: s for s in named(spans, "streamq.submit")}
    for run in named(spans, "streamq.handler"):
        assert run.parent is not None and run.parent.span_id in submits
        assert submits[run.parent.span_id].context.trace_id == run.context.trace_id
    late, = named(spans, "streamq.handler", job_id=later.id)
    assert (submits[late.parent.span_id].attributes or {})["streamq.job_id"] == later.id


def test_a_worker_process_exports_its_spans_into_the_submitters_trace(
    redis_url: str, queue_name: str, otel: Any, queues: Callable[[Queue], Queue],
) -> None:
    """``streamq worker`` with STREAMQ_TRACING=1 and no provider of its own sets up the
    SDK from the OTEL_* variables (here the console exporter, on its stdout)."""
    provider, exporter = otel
    worker = _streamq(redis_url, "worker", queue_name, "--handler", "handlers:echo",
                      "--log-level", "WARNING", STREAMQ_TRACING="1",
                      OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="tracing-test")
    try:
        q = queues(Queue(queue_name, redis_url, tracing=provider))
        job = q.submit([1, 2])
        assert job.wait(timeout=30).state == JobState.SUCCEEDED
    finally:
        worker.terminate()
        out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    submit, = named(list(exporter.get_finished_spans()), "streamq.submit")
    trace_id = f"0x{submit.context.trace_id:032x}"
    parent = f"0x{submit.context.span_id:016x}"
    decoder, spans, at = json.JSONDecoder(), [], out.find("{")
    while at >= 0:
        span, end = decoder.raw_decode(out, at)
        spans.append(span)
        at = out.find("{", end)
    mine = [s for s in spans if s["context"]["trace_id"] == trace_id]
    assert sorted(s["name"] for s in mine) == sorted(
        ["streamq.wait", "streamq.handler", "streamq.ack"] * 2)
    assert all(s["parent_id"] == parent for s in mine)
    assert {s["resource"]["attributes"]["service.name"] for s in mine} == {"tracing-test"}


@pytest.mark.parametrize("size", [1, 2], ids=["lane", "job"])
def test_a_cancel_drops_a_retry_that_carries_a_context(
    redis_url: str, queue_name: str, r: redis.Redis, workers: StartWorker, otel: Any,
    queues: Callable[[Queue], Queue], size: int,
) -> None:
    provider, _ = otel

    def fail(p: int) -> int:
        raise ValueError("again")

    workers(queue_name, fail, tracing=provider, retry_base_s=60)
    q = queues(Queue(queue_name, redis_url, tracing=provider))
    job = q.submit(list(range(size)), priority=0, client="c", max_deliveries=5)
    retry = QueueKeys(queue_name).lane_retry(0, "c") if size == 1 else JobKeys(job.id, queue_name).retry
    deadline = time.monotonic() + 20
    while r.zcard(retry) < size:
        assert time.monotonic() < deadline, "no retry waiting"
        time.sleep(0.05)
    assert all(b",00-" in m for m in r.zrange(retry, 0, -1))  # the context is kept
    assert q.cancel(job.id).cancelled
    assert job.wait(timeout=20).state == JobState.CANCELLED
    assert r.zcard(retry) == 0
