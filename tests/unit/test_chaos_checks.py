"""The fault suite's own checks fire: the concurrency cap (tests/chaos/overlap.py), late
values and cancel reports (tests/chaos/check.py), on hand-made records that break them
and on records that stay within the design's exceptions. No server needed."""

from __future__ import annotations

from pathlib import Path

from tests.chaos.check import (
    cancel_misreported,
    finished_past_a_lost_write,
    late_value,
    lost_in_crash,
    open_past_a_lost_finalize,
    redone_after_crash,
)
from tests.chaos.overlap import HOLD_S, NS, Caps, HandlerRun, Liveness, check_caps, read_records

MS = 1_000_000
LIFETIME = 900 * MS  # three heartbeats of 0.3 s


def beats(pid: int, start_ms: int, end_ms: int, every_ms: int = 300,
          skip: tuple[int, int] | None = None) -> dict[str, list[tuple[int, int]]]:
    """A process's heartbeats every ``every_ms`` (each taking 5 ms), none in ``skip``."""
    out = []
    for t in range(start_ms, end_ms, every_ms):
        if skip is None or not skip[0] <= t < skip[1]:
            out.append((t * MS, (t + 5) * MS))
    return {f"{pid}-a": out}


def run(job: str, index: int, pid: int, start_ms: int, end_ms: int | None,
        deadline_ms: int | None = None) -> HandlerRun:
    r = HandlerRun(job, index, f"{pid}-a.{index}", start_ms * MS)
    if end_ms is not None:
        r.end, r.how = end_ms * MS, "E"
    if deadline_ms is not None:
        r.deadline = deadline_ms * MS
    return r


def violations(runs: list[HandlerRun], beats_: dict[str, list[tuple[int, int]]],
               cap: int | Caps = 1, outages: list[tuple[int, int]] | None = None) -> list[str]:
    caps = {r.job: cap if isinstance(cap, Caps) else Caps(cap) for r in runs}
    return check_caps(runs, caps, {}, Liveness(beats_, LIFETIME, outages or []))


def test_two_runs_at_once_of_a_job_of_concurrency_1_by_live_workers_exceed_its_cap() -> None:
    both_beat = {**beats(1, 0, 20_000), **beats(2, 0, 20_000)}
    runs = [run("j", 0, 1, 10_000, 12_000), run("j", 1, 2, 11_000, 11_500)]
    bad = violations(runs, both_beat)
    assert len(bad) == 1 and "cap 1: 2 runs at once" in bad[0]
    # one after the other is fine
    assert violations([run("j", 0, 1, 10_000, 11_000), run("j", 1, 2, 11_000, 12_000)],
                      both_beat) == []


def test_the_run_of_a_process_presumed_dead_does_not_count() -> None:
    # Given process 1 whose beats stopped for 2 s (past its 0.9 s lifetime) during its run
    stalled = {**beats(1, 0, 20_000, skip=(10_100, 12_100)), **beats(2, 0, 20_000)}
    runs = [run("j", 0, 1, 10_000, 13_000), run("j", 1, 2, 11_500, 12_000)]
    # Then the second run, after its token went back, is the documented exception
    assert violations(runs, stalled) == []
    # But a second run started before the lifetime ran out is not
    early = [run("j", 0, 1, 10_000, 13_000), run("j", 1, 2, 10_500, 12_000)]
    assert len(violations(early, stalled)) == 1


def test_beats_missed_while_redis_was_away_for_everyone_are_no_stall() -> None:
    # Given beats of both processes missing only while Redis was restarting (1.5 s)
    outage = (10_100, 11_600)
    missed = {**beats(1, 0, 20_000, skip=outage), **beats(2, 0, 20_000, skip=outage)}
    runs = [run("j", 0, 1, 10_000, 13_000), run("j", 1, 2, 11_700, 12_000)]
    # Then with the outage known the overlap is a violation, without it an exception
    assert len(violations(runs, missed, outages=[(outage[0] * MS, outage[1] * MS)])) == 1
    assert violations(runs, missed) == []


def test_a_killed_process_run_ends_at_its_death(tmp_path: Path) -> None:
    # Given records: pid 1 started a run and was killed; pid 2 ran the job after
    (tmp_path / "runs-1-a.log").write_text("S j 0 1 1-a.1 1000000000 -\n")
    (tmp_path / "runs-2-a.log").write_text("S j 1 1 2-a.1 3000000000 -\n"
                                           "E j 1 2-a.1 3500000000\n"
                                           "S j 0 2 2-a.2 3600000000 4000000000\n"
                                           "L j 0 2-a.2 4700000000\n")
    (tmp_path / "beats-2-a.log").write_text("B 900000000 905000000\n")
    # (pid 1 also died before this run started: a pid may be reused)
    rec = read_records(tmp_path, deaths={1: [500_000_000, 2_000_000_000]})
    by_id = {r.run: r for r in rec.runs}
    assert by_id["1-a.1"].end == 2_000_000_000 and by_id["1-a.1"].how == ""
    assert by_id["2-a.1"].how == "E" and by_id["2-a.2"].how == "L"
    assert by_id["2-a.2"].deadline == 4_000_000_000
    assert rec.beats["2-a"] == [(900_000_000, 905_000_000)]
    every = {**beats(1, 0, 10_000), **beats(2, 0, 10_000)}
    assert check_caps(rec.runs, {"j": Caps(1)}, {}, Liveness(every, LIFETIME)) == []
    # without the death noted, the killed run would still be under way
    rec = read_records(tmp_path)
    assert len(check_caps(rec.runs, {"j": Caps(1)}, {}, Liveness(every, LIFETIME))) == 2


def test_a_run_past_its_timeout_does_not_count_until_then() -> None:
    live = {**beats(1, 0, 20_000), **beats(2, 0, 20_000)}
    # a run given up at its deadline (10.8 s) goes on; another starts at 11 s
    runs = [run("j", 0, 1, 10_000, 12_500, deadline_ms=10_800), run("j", 0, 2, 11_000, 11_200)]
    assert violations(runs, live) == []
    before = [run("j", 0, 1, 10_000, 12_500, deadline_ms=10_800), run("j", 1, 2, 10_500, 10_600)]
    assert len(violations(before, live)) == 1


def test_the_cap_in_force_follows_re_prioritize() -> None:
    live = {proc: b for p in (1, 2, 3) for proc, b in beats(p, 0, 40_000).items()}
    # Given a job of concurrency 2 lowered to 1 (sent 10.0 s, returned 10.1 s)
    caps = Caps(2)
    caps.change(1, 10_000 * MS, 10_100 * MS)
    # Then two runs at once within HOLD_S after the change are the held token's batch
    soon = [run("j", 0, 1, 10_200, 10_500), run("j", 1, 2, 10_300, 10_400)]
    assert violations(soon, live, caps) == []
    # but not once every holder's round is over
    t = int(10_100 + HOLD_S * 1000) + 100
    late = [run("j", 0, 1, t, t + 300), run("j", 1, 2, t + 100, t + 200)]
    assert len(violations(late, live, caps)) == 1
    # When it is raised back to 2, two at once are fine again, three are not (the
    # defect where a token still leased was handed to a second slot)
    caps.change(2, 20_000 * MS, 20_100 * MS)
    two = [run("j", 0, 1, 20_050, 20_500), run("j", 1, 2, 20_060, 20_400)]
    assert violations(two, live, caps) == []
    three = [*two, run("j", 2, 3, 20_070, 20_300)]
    bad = violations(three, live, caps)
    assert len(bad) == 1 and "cap 2: 3 runs at once" in bad[0]


def test_caps_take_the_figure_sent_while_unconfirmed() -> None:
    caps = Caps(3)
    caps.change(1, 5 * NS, float("inf"))  # never confirmed: 3 stays in force
    assert caps.at(100 * NS) == 3
    caps = Caps(1)
    caps.change(3, 5 * NS, 6 * NS)
    assert caps.at(4 * NS) == 1 and caps.at(5 * NS) == 3


def test_a_late_value_and_a_misreported_cancel_are_caught() -> None:
    assert late_value({"u": "p0-1", "late": True})
    assert not late_value({"u": "p0-1", "v": 7}) and not late_value(b"x")
    # a resent cancel that reported cancelling must see the job end cancelled
    assert cancel_misreported(True, "cancelled", "succeeded")
    assert not cancel_misreported(True, "cancelled", "cancelled")
    # one that reported the job ended otherwise must see it end that way
    assert not cancel_misreported(False, "succeeded", "succeeded")
    assert cancel_misreported(False, "cancelled", "cancelled")  # cancelled by whom, then?
    assert cancel_misreported(False, "active", "succeeded")  # the state read before the call


def test_a_completion_published_again_only_across_a_redis_crash_is_excused() -> None:
    crash = 1_000.0  # epoch seconds of a SIGKILL of Redis
    # published 50 ms before the crash, its writes lost, recorded again after it
    assert redone_after_crash(999_950, 1_000_400, [crash])
    # not when the surviving record is from before the crash (nothing was lost), when
    # the first publication came long before it, or when Redis never crashed
    assert not redone_after_crash(999_950, 999_960, [crash])
    assert not redone_after_crash(990_000, 1_000_400, [crash])
    assert not redone_after_crash(999_950, 1_000_400, [])


def test_a_job_missing_after_redis_lost_its_last_writes_is_excused_only_then() -> None:
    crash = 1_000.0  # epoch seconds of a SIGKILL of Redis (appendfsync everysec)
    # confirmed in the moment before the kill, or read a little after a reply sent before it
    assert lost_in_crash(999.5, [crash]) and lost_in_crash(1_000.3, [crash])
    # not when it was confirmed long before the crash, or after Redis was back, or when
    # Redis never crashed
    assert not lost_in_crash(990.0, [crash])
    assert not lost_in_crash(1_005.0, [crash])
    assert not lost_in_crash(999.5, [])


def test_a_job_whose_own_write_was_lost_in_a_crash_and_finished_after_it_is_excused() -> None:
    # Given a SIGKILL of Redis at t=100 s (it may lose the writes of the 2 s before it)
    crashes = [100.0]
    # Then a job confirmed 0.2 s before it, whose completion the queue recorded after the
    # restart while its own slot still says active, lost its own slot's last write
    assert finished_past_a_lost_write(99.8, [101_500], crashes)
    # But not one whose completion was recorded before the crash (a real stuck job),
    # nor one confirmed long before the crash, nor one the queue never finished
    assert not finished_past_a_lost_write(99.8, [99_900], crashes)
    assert not finished_past_a_lost_write(90.0, [101_500], crashes)
    assert not finished_past_a_lost_write(99.8, [], crashes)
    assert not finished_past_a_lost_write(99.8, [101_500], [])


def test_an_open_job_whose_finalize_redis_lost_in_a_crash_is_excused_only_then() -> None:
    crash = 1_000.0
    # finalize returned 0.1 s before the kill: in the writes the crash may lose
    assert open_past_a_lost_finalize("open", True, 999.9, [crash])
    # returned long before the crash, or with no crash at all: a stuck job
    assert not open_past_a_lost_finalize("open", True, 990.0, [crash])
    assert not open_past_a_lost_finalize("open", True, 999.9, [])
    # never finalized by its producer, or not open: not this excuse
    assert not open_past_a_lost_finalize("open", False, 0.0, [crash])
    assert not open_past_a_lost_finalize("active", True, 999.9, [crash])
