"""The one runner both lanes' entries take (work/entries.py), against a source that
records what it was asked (work/sources.py's interface): no server. What the runner
decides is the same whichever store a batch came from."""

from __future__ import annotations

import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

from streamq.base import cancels
from streamq.base.entry_fields import _parse
from streamq.work.entries import EntryRunner
from streamq.work.sources import Done, Fields, Read


class Recorder:
    """A source whose entries are ``i``/``t``/``p`` (plus ``s`` when suspect) of one job
    each (``job`` per entry) or of one job; it records every call."""

    limit: float | None = None

    def __init__(self, jobs: dict[str, str], start_ok: bool = True) -> None:
        self.jobs, self.start_ok = jobs, start_ok
        self.calls: list[tuple[Any, ...]] = []
        self.acked: list[list[str]] = []

    def fields(self, flat: list[bytes]) -> Fields:
        index = _parse(flat)[0]
        return (self.jobs[str(index)], *_parse(flat))

    def of_job(self, rest: list[Read], job: str) -> list[Read]:
        return [r for r in rest if self.fields(r[1])[0] == job]

    def settled(self, eid: str) -> None:
        self.calls.append(("settled", eid))

    def start(self, eid: str) -> bool:
        self.calls.append(("start", eid))
        return self.start_ok

    def fail(self, eid: str, job: str, index: int, attempts: int, delay_ms: int,
             error: str, kind: bytes, raw: bytes) -> bool:
        self.calls.append(("fail", eid, delay_ms, error.splitlines()[0]))
        return False

    def hand_back(self, rest: list[Read]) -> None:
        self.calls.append(("hand_back", [r[0].decode() for r in rest]))

    def behind_slow(self, rest: list[Read]) -> None:
        self.calls.append(("behind_slow", [r[0].decode() for r in rest]))

    def flush(self, done: list[Done]) -> bool:
        self.acked.append([d[0] for d in done])
        done.clear()
        return False


def _entries(n: int, suspect: tuple[int, ...] = ()) -> tuple[list[Read], list[str]]:
    ids = [f"{1000 + k}-0" for k in range(n)]
    reads: list[Read] = []
    for k, eid in enumerate(ids):
        flat = [b"i", str(k).encode(), b"t", b"j", b"p", str(k).encode()]
        if k in suspect:
            flat += [b"s", b"1"]
        reads.append((eid.encode(), flat))
    return reads, ids


def _slow(s: float) -> Any:
    def handle(p: Any) -> Any:
        time.sleep(s)
        return p
    return handle


def _recording(ran: list[Any]) -> Any:
    def handle(p: Any) -> Any:
        ran.append(p)
        return p
    return handle


def _runner(handler: Any, ack_flush_s: float = 60.0) -> EntryRunner:
    outcomes = SimpleNamespace(observe=lambda w, d: (w.clear(), d.clear()),
                               count_failure=lambda job, index, attempt, e, text: 250)
    worker = SimpleNamespace(outcomes=outcomes, stopping=threading.Event(), handler=handler,
                             loop=None, ack_flush_s=ack_flush_s, tracer=None, governor=None,
                             q=SimpleNamespace(name="q"))
    return EntryRunner(worker)


def test_every_entry_runs_in_order_and_its_result_is_returned_to_acknowledge() -> None:
    src = Recorder({str(k): "job-a" for k in range(3)})
    reads, ids = _entries(3)
    done, completed = _runner(lambda p: p * 10).run_entries(src, reads, ids, [], [])
    assert [(d[0], d[2]) for d in done] == [("1000-0", b"j0"), ("1001-0", b"j10"),
                                            ("1002-0", b"j20")]
    assert (completed, src.calls, src.acked) == (False, [], [])


def test_results_are_acknowledged_every_ack_flush_s_while_the_batch_runs() -> None:
    src = Recorder({str(k): "job-a" for k in range(4)})
    reads, ids = _entries(4)
    done, _ = _runner(_slow(0.02), ack_flush_s=0.0).run_entries(
        src, reads, ids, [], [])
    assert src.acked == [["1000-0"], ["1001-0"], ["1002-0"], ["1003-0"]] and done == []


def test_a_failure_is_reported_to_the_source_with_its_delay_and_the_rest_runs() -> None:
    src = Recorder({str(k): "job-a" for k in range(3)})
    reads, ids = _entries(3)

    def handle(p: int) -> int:
        if p == 1:
            raise ValueError("no")
        return p

    done, _ = _runner(handle).run_entries(src, reads, ids, [], [])
    assert src.calls == [("fail", "1001-0", 250, "ValueError: no"), ("settled", "1001-0")]
    assert [d[0] for d in done] == ["1000-0", "1002-0"]


def test_a_cancelled_jobs_entries_go_back_and_the_other_jobs_run() -> None:
    # a lane batch: each entry its own job; job-b is cancelled
    gone = f"job-{uuid.uuid4().hex}"  # (a process never forgets a cancel it saw)
    src = Recorder({"0": "job-a", "1": gone, "2": "job-c"})
    reads, ids = _entries(3)
    cancels.add([gone])
    ran: list[int] = []
    done, _ = _runner(_recording(ran)).run_entries(src, reads, ids, [], [])
    assert ran == [0, 2] and src.calls == [("hand_back", ["1001-0"])]


def test_a_cancelled_job_of_the_whole_batch_starts_nothing() -> None:
    gone = f"job-{uuid.uuid4().hex}"
    src = Recorder({str(k): gone for k in range(3)})
    reads, ids = _entries(3)
    cancels.add([gone])
    ran: list[int] = []
    done, _ = _runner(ran.append).run_entries(src, reads, ids, [], [])
    assert (ran, done) == ([], []) and src.calls == [
        ("hand_back", ["1000-0", "1001-0", "1002-0"])]
    assert cancels.listable([gone]) == [gone]  # the slot starts nothing of it: a beat lists it


def test_a_job_is_listed_as_noted_only_outside_a_slots_check_to_start_step() -> None:
    # a beat lists a cancelled job only when no slot is between its check of the cancels
    # and its handler's call (the "in_handler" point is in that step)
    from streamq.base import hooks

    job = f"job-{uuid.uuid4().hex}"
    src = Recorder({"0": job, "1": job})
    reads, ids = _entries(2)
    seen: list[tuple[str, list[str]]] = []

    def note(where: str) -> None:
        seen.append((where, cancels.listable([job])))

    hooks.install(lambda point: note("checked") if point == "in_handler" else None)
    try:
        _runner(lambda p: note("handler")).run_entries(src, reads, ids, [], [])
    finally:
        hooks.install(None)
    assert seen == [("checked", []), ("handler", [job])] * 2
    assert cancels.listable([job]) == [job]


def test_a_suspect_entry_acknowledges_what_is_done_then_records_its_start() -> None:
    src = Recorder({str(k): "job-a" for k in range(3)})
    reads, ids = _entries(3, suspect=(1,))
    done, _ = _runner(lambda p: p).run_entries(src, reads, ids, [], [])
    assert src.acked == [["1000-0"]] and src.calls == [("start", "1001-0")]
    assert [d[0] for d in done] == ["1001-0", "1002-0"]


def test_a_suspect_entry_settled_elsewhere_does_not_run() -> None:
    src = Recorder({str(k): "job-a" for k in range(2)}, start_ok=False)
    reads, ids = _entries(2, suspect=(0,))
    ran: list[int] = []
    _runner(_recording(ran)).run_entries(src, reads, ids, [], [])
    assert ran == [1] and src.calls == [("start", "1000-0"), ("settled", "1000-0")]


def test_after_a_slow_handler_the_rest_goes_back_for_others_to_take() -> None:
    src = Recorder({str(k): "job-a" for k in range(3)})
    reads, ids = _entries(3)
    runner = _runner(_slow(0.06))
    done, _ = runner.run_entries(src, reads, ids, [], [])
    assert [d[0] for d in done] == ["1000-0"]
    assert src.calls == [("behind_slow", ["1001-0", "1002-0"])] and runner.slow_now()


def test_a_stopping_worker_hands_back_what_it_has_not_started() -> None:
    src = Recorder({str(k): "job-a" for k in range(3)})
    reads, ids = _entries(3)
    runner = _runner(None)

    def handle(p: int) -> int:
        runner.w.stopping.set()
        return p

    runner.w.handler = handle  # type: ignore[misc]
    done, _ = runner.run_entries(src, reads, ids, [], [])
    assert [d[0] for d in done] == ["1000-0"]
    assert src.calls == [("hand_back", ["1001-0", "1002-0"])]
