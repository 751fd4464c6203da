"""Hostile payloads and results: nested 100,000 deep, a megabyte of escapes, invalid
UTF-8, NaN and Infinity, a result that cannot be encoded. Each is a clear error at
submit, or a dead letter with its reason at the worker; none kills a worker or
stalls a slot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from streamq import JobState, PayloadError, Queue, Worker
from streamq.base.keys import JobKeys

ROOT = Path(__file__).resolve().parents[2]
DEEP = "[" * 100_000 + "]" * 100_000  # JSON nested 100,000 deep


def deep_list(n: int = 100_000) -> list[Any]:
    v: list[Any] = []
    for _ in range(n):
        v = [v]
    return v


def test_a_hostile_payload_is_refused_at_submit_and_nothing_is_enqueued(
    r: redis.Redis, redis_url: str, queue_name: str
) -> None:
    q = Queue(queue_name, redis_url)
    before = r.dbsize()
    with pytest.raises(PayloadError, match="nested too deeply"):
        q.submit([1, deep_list()])
    with pytest.raises(PayloadError, match="not bytes, str or JSON"):
        q.submit([{"x": float("inf")}])
    assert r.dbsize() == before
    # the CLI says so in one line, and enqueues nothing either
    env = dict(os.environ, STREAMQ_REDIS_URL=redis_url, PYTHONPATH=str(ROOT))
    for line in (DEEP, '{"x": NaN}'):
        out = subprocess.run([sys.executable, "-m", "streamq", "submit", queue_name, "-"],
                             input=f"1\n{line}\n", text=True, capture_output=True, env=env,
                             cwd=ROOT, timeout=60)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert lines[0].startswith("streamq: ") and "line 2 of stdin" in lines[0]
        assert "Traceback" not in out.stderr
    assert r.dbsize() == before
    q.close()


def test_hostile_entries_are_dead_lettered_with_their_reason_and_the_worker_goes_on(
    r: redis.Redis, redis_url: str, queue_name: str, workers: Any
) -> None:
    # Given a job whose entries were written by something other than streamq
    q = Queue(queue_name, redis_url)
    sj = q.open(concurrency=2, max_deliveries=1)
    sj.add("fine")
    jk = JobKeys(sj.id, queue_name)
    escapes = '"' + "\\n" * (1 << 19) + '"'  # 1 MiB of escapes: valid, 512 Ki newlines
    raw: list[tuple[str, bytes]] = [
        ("j", DEEP.encode()),
        ("j", b"NaN"),
        ("j", b'{"x": -Infinity}'),
        ("s", b"\xff\xfe not UTF-8"),
        ("j", b'"\xff"'),
        ("j", escapes.encode()),
    ]
    for i, (kind, data) in enumerate(raw, start=1):
        r.xadd(jk.tasks, {"i": i, "t": kind, "p": data})
    r.hincrby(jk.meta, "total", len(raw))
    r.hincrby(jk.meta, "remaining", len(raw))
    sj.add("deep result")  # index 7: the handler returns what cannot be encoded

    def handler(p: Any) -> Any:
        if p == "deep result":
            return deep_list()
        return len(p)

    w: Worker = workers(queue_name, handler, concurrency=2)
    sj.finalize()
    # When the worker serves it
    st = q.wait(sj.id, timeout=60)
    # Then the good entries have results, and every hostile one a dead letter saying why
    assert (st.state, st.done, st.failed) == (JobState.PARTIAL, 2, 6)
    assert q.results(sj.id) == {0: 4, 6: 1 << 19}
    errors = {int(d.index): d.error for d in q.dead_letters(job_id=sj.id)}
    assert "nested too deeply" in errors[1]
    assert "NaN is not JSON" in errors[2] and "Infinity is not JSON" in errors[3]
    assert "utf-8" in errors[4] and "malformed" in errors[5]
    assert "nested too deeply" in errors[7]
    # and the worker is alive and serves the next job
    after = q.submit(["next"])
    assert after.wait(timeout=30).state is JobState.SUCCEEDED
    assert q.results(after.id) == {0: 4}
    assert w.fatal is None
    q.close()
