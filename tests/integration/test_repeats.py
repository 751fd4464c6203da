"""Repeating jobs: one job per tick however many tickers run, across a ticker killed
between its submit and its advance, paused, resumed and removed; ticked by a worker
alone and by a reaper process (real redis-server)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis
from conftest import Procs, wait_until

from streamq import JobState, Queue
from streamq.base.keys import JobKeys
from streamq.errors import ConfigError
from streamq.reaping.ticker import _submit, tick_repeats
from streamq.services.repeats import RepeatSpec, tick_job_id
from streamq.storage.connection import server_ms


def tick_jobs(r: Any, queue: str, name: str) -> list[int]:
    """The ticks whose job exists, in order (a tick's job id ends with its time)."""
    prefix = f"sq:{{{queue}/{queue}.{name}."
    ticks = [int(k.decode()[len(prefix):].split("}")[0])
             for k in r.scan_iter(match=f"{prefix}*}}:meta", count=1000)]
    return sorted(ticks)


def on_grid(ticks: list[int], every_ms: int) -> None:
    """Each tick a whole number of intervals after the one before: one job per tick,
    none off its schedule (a tick no ticker took in time, on a loaded machine, is
    skipped, not made up: a gap of two intervals or more)."""
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert all(g > 0 and g % every_ms == 0 for g in gaps), gaps


@pytest.mark.cluster_too
def test_a_repeat_submits_one_job_per_tick_however_many_tickers_run(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given a repeat every second and four tickers, each with its own client, racing
    q = Queue(queue_name, redis_url)
    rep = q.repeats.add("beat", [{"n": 1}], every=1, priority=3)
    assert (rep.paused, rep.last_ms, rep.spec.schedule) == (False, None, "every 1 s")
    created: Counter[int] = Counter()
    stop = threading.Event()

    def ticker(i: int) -> None:
        mine = Queue(queue_name, redis_url)
        while not stop.is_set():
            created[i] += tick_repeats(mine)
            time.sleep(0.01)
        mine.close()

    threads = [threading.Thread(target=ticker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(4.5)
    stop.set()
    for t in threads:
        t.join(10)
    # Then each tick made one job, of the repeat's settings, one second apart, and the
    # jobs the tickers say they created are those
    ticks = tick_jobs(r, queue_name, "beat")
    assert len(ticks) >= 3, ticks
    on_grid(ticks, 1000)
    assert ticks[0] == rep.next_ms
    assert sum(created.values()) == len(ticks)
    st = q.status(tick_job_id(queue_name, "beat", ticks[0]))
    assert (st.total, st.priority) == (1, 3)
    now = q.repeats.get("beat")
    assert now.last_ms == ticks[-1] and now.last_job == tick_job_id(queue_name, "beat", ticks[-1])
    assert now.next_ms is not None and on_grid([ticks[-1], now.next_ms], 1000) is None
    q.close()


def test_a_ticker_killed_between_its_submit_and_its_advance_leaves_one_job(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    # Given a due tick whose job a ticker submitted, which then died before advancing
    q = Queue(queue_name, redis_url)
    rep = q.repeats.add("once", ["p"], every=1)
    wait_until(lambda: server_ms(r, q.keys.repeat_next) >= (rep.next_ms or 0), 5, "the tick")
    spec = RepeatSpec.from_json(r.hget(q.keys.repeats, "once"))  # type: ignore[arg-type]
    assert _submit(q, spec, "once", rep.next_ms or 0) == 1
    assert q.repeats.get("once").next_ms == rep.next_ms  # not advanced: still due
    # When the next ticker runs
    assert tick_repeats(q) == 0
    # Then it found that job, made no other, and advanced the repeat
    assert tick_jobs(r, queue_name, "once") == [rep.next_ms]
    after = q.repeats.get("once")
    assert after.last_ms == rep.next_ms and (after.next_ms or 0) > (rep.next_ms or 0)
    # And a ticker that read the old tick and advances late changes nothing (the
    # advance compares the tick it read with the repeat's next tick)
    keys = (q.keys.repeats, q.keys.repeat_next, q.keys.repeat_last)
    stale = (after.next_ms or 0) + 5000
    assert q.scripts.run("repeat_advance", keys, ("once", rep.next_ms, stale)) == 0
    assert q.repeats.get("once").next_ms == after.next_ms
    q.close()


def test_pause_resume_and_remove(r: redis.Redis, redis_url: str, queue_name: str) -> None:
    q = Queue(queue_name, redis_url)
    q.repeats.add("p", ["x"], every=1)
    # Given a paused repeat: no tick is due, however long it waits
    assert q.repeats.pause("p") is True and q.repeats.pause("p") is False
    assert q.repeats.get("p").paused
    time.sleep(1.2)
    assert tick_repeats(q) == 0 and tick_jobs(r, queue_name, "p") == []
    # When resumed: its next tick is the first after now (nothing made up)
    assert q.repeats.resume("p") is True and q.repeats.resume("p") is False
    nxt = q.repeats.get("p").next_ms or 0
    assert 0 < nxt - server_ms(r, q.keys.repeat_next) <= 1000
    wait_until(lambda: tick_repeats(q) == 1, 5, "a tick after the resume")
    # When removed: it is gone, its job stays, a tick read before the remove changes nothing
    jid = q.repeats.get("p").last_job
    assert q.repeats.remove("p") is True and q.repeats.remove("p") is False
    assert q.repeats.list() == [] and r.exists(JobKeys(jid or "", queue_name).meta)
    assert q.scripts.run("repeat_advance", (q.keys.repeats, q.keys.repeat_next,
                                            q.keys.repeat_last), ("p", nxt, nxt + 1000)) == 0
    for bad in (q.repeats.pause, q.repeats.resume, q.repeats.get):
        with pytest.raises(ConfigError, match="has no repeat 'p'"):
            bad("p")
    q.close()


def test_a_bad_repeat_stores_nothing_and_a_replace_keeps_the_last_tick(
        r: redis.Redis, redis_url: str, queue_name: str) -> None:
    q = Queue(queue_name, redis_url)
    for kwargs in ({"cron": "0 3 * * *", "every": 5}, {"cron": "nope"},
                   {"every": 5, "tz": "Nowhere/Else"}, {"every": 5, "priority": 100}):
        with pytest.raises(ConfigError):
            q.repeats.add("bad", ["x"], **kwargs)
    with pytest.raises(Exception, match="JSON"):
        q.repeats.add("bad", [object()], every=5)
    assert q.repeats.list() == [] and not r.exists(q.keys.repeats)
    # Given a repeat that ticked once, replaced by a cron schedule
    q.repeats.add("r", ["x"], every=1)
    wait_until(lambda: tick_repeats(q) == 1, 5, "a first tick")
    last = q.repeats.get("r").last_ms
    new = q.repeats.add("r", ["y"], cron="0 3 * * *", tz="Asia/Tokyo")
    # Then it keeps its last tick, and its next one is 03:00 in Tokyo
    assert new.last_ms == last and new.spec.payloads == ["y"]
    assert new.next_at is not None and new.next_at.astimezone(
        __import__("zoneinfo").ZoneInfo("Asia/Tokyo")).strftime("%H:%M") == "03:00"
    # A script refuses a tick far from Redis's clock, whoever calls it
    qk = q.keys
    with pytest.raises(ConfigError, match="within a year"):
        q.repeats._run("repeat_set", (qk.repeats, qk.repeat_next, qk.repeat_last),
                       ("r", new.spec.to_json(), 1), "r")
    q.close()


def test_a_repeat_runs_with_workers_alone(
        r: redis.Redis, redis_url: str, queue_name: str, procs: Procs) -> None:
    """No reaper: a worker's recovery thread submits the ticks; the worker runs them."""
    q = Queue(queue_name, redis_url)
    q.repeats.add("w", [{"n": 2}], every=1)
    procs.worker(queue_name, "tests.handlers:echo", env={"STREAMQ_RECOVER": "1"})
    wait_until(lambda: len(tick_jobs(r, queue_name, "w")) >= 3, 30, "three ticks")
    last = q.repeats.get("w")
    first = tick_jobs(r, queue_name, "w")[0]
    st = q.wait(tick_job_id(queue_name, "w", first), timeout=30)
    assert st.state is JobState.SUCCEEDED
    assert q.results(tick_job_id(queue_name, "w", first)) == {0: {"n": 2}}
    assert last.last_ms is not None
    q.close()


def test_a_reaper_process_ticks_and_its_restart_makes_no_second_job(
        r: redis.Redis, redis_url: str, queue_name: str, procs: Procs) -> None:
    q = Queue(queue_name, redis_url)
    q.repeats.add("rr", ["x"], every=1)
    first = procs.reaper(queue_name)
    second = procs.reaper(queue_name)
    wait_until(lambda: len(tick_jobs(r, queue_name, "rr")) >= 2, 30, "two ticks")
    first.kill()
    first.wait()
    restarted = procs.reaper(queue_name)
    n = len(tick_jobs(r, queue_name, "rr"))
    wait_until(lambda: len(tick_jobs(r, queue_name, "rr")) >= n + 2, 30, "two more ticks")
    second.kill()
    restarted.kill()
    on_grid(tick_jobs(r, queue_name, "rr"), 1000)
    q.close()
