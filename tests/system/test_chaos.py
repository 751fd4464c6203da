"""The short form of the fault suite (``make chaos`` runs the long one).

Real worker and reaper processes and a redis-server with AOF, for about 25 s of
SIGKILLs (at random and at every fault point), a Redis restart, CLIENT KILL,
dropped replies, OOM and BUSY spells, queue pauses and skewed clocks, with
scheduled jobs among the load, jobs re-prioritized and cancelled (resent after a lost
reply) while they run, and async handlers that run past their job's timeout; then
every invariant of docs/design/invariants.md is checked (tests/chaos/check.py), the concurrency
cap on the handlers' own start and end records. The seed is random unless
``STREAMQ_CHAOS_SEED`` names one; a failure prints the report with the seed, so
``python -m tests.chaos --seed N --duration 25`` runs the same schedule again. It runs
on a queue of one shard and on one of three (``--shards``), and on one shard with
streamq's Redis module loaded (``--module``: every function call is SQ.FCALL).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.chaos


@pytest.mark.timeout(170)
@pytest.mark.parametrize(("shards", "module"), [(1, False), (3, False), (1, True)],
                         ids=["1-shard", "3-shards", "1-shard-module"])
def test_chaos_short_form(shards: int, module: bool) -> None:
    args = ["--duration", "25", "--workers", "4", "--settle", "30", "--shards", str(shards),
            *(["--module"] if module else [])]
    if os.environ.get("STREAMQ_CHAOS_SEED"):
        args += ["--seed", os.environ["STREAMQ_CHAOS_SEED"]]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # its own process group: if it ever hangs, its workers and redis-server go with it
    proc = subprocess.Popen([sys.executable, "-m", "tests.chaos", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        report, _ = proc.communicate(timeout=160)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        report, _ = proc.communicate()
        pytest.fail(f"the chaos run did not end in 160 s:\n{report}")
    assert "invariants  losses" in report, f"the chaos run did not report:\n{report}"
    assert proc.returncode == 0, f"an invariant was violated under faults:\n{report}"
    # the steering scenarios ran: re-prioritize, cancels resent after a lost reply, async
    # workers, jobs with a timeout; and the concurrency check had handler runs to time
    steering = re.search(r"^steering +(.*)$", report, re.M)
    assert steering and "reprioritize applied" in steering[1], report
    assert re.search(r"cancel \w+ resent \d", steering[1]), report
    assert int(re.search(r"async workers (\d+)", report)[1]) > 0, report  # type: ignore[index]
    assert int(re.search(r"timeout (\d+)", report)[1]) > 0, report  # type: ignore[index]
    assert int(re.search(r"\((\d+) timed runs", report)[1]) > 0, report  # type: ignore[index]
