"""Number options given NaN or infinity: each is refused as bad input (one line,
exit 2) before anything runs, never a traceback nor a wait that never ends."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from streamq import Queue
from streamq.cli import ExitCode, app

runner = CliRunner()

#: (arguments, the option named in the error); KNOWN is a queue that exists
NON_FINITE = [
    (["pending", "KNOWN", "--min-idle", "nan"], "--min-idle"),
    (["pending", "KNOWN", "--min-idle", "inf"], "--min-idle"),
    (["watch", "KNOWN", "--interval", "nan"], "--interval"),
    (["watch", "KNOWN", "--interval", "inf"], "--interval"),
    (["submit", "KNOWN", "1", "--wait", "--timeout", "nan"], "--timeout"),
    (["subscribe", "KNOWN", "--timeout", "nan"], "--timeout"),
    (["health", "--worker", "--max-age", "nan"], "--max-age"),
    (["worker", "KNOWN", "--handler", "tests.handlers:echo", "--heartbeat", "nan"],
     "--heartbeat"),
    (["worker", "KNOWN", "--handler", "tests.handlers:echo", "--retry-base", "inf"],
     "--retry-base"),
    (["reaper", "KNOWN", "--interval", "nan"], "--interval"),
    (["reaper", "KNOWN", "--min-idle", "inf"], "--min-idle"),
    (["reaper", "KNOWN", "--retention", "nan"], "--retention"),
]


@pytest.mark.timeout(30)  # before the fix, a NaN timeout waited for ever
@pytest.mark.parametrize(("args", "option"), NON_FINITE,
                         ids=[" ".join(a[:1] + a[-2:]) for a, _ in NON_FINITE])
def test_a_number_that_is_not_finite_is_refused_in_one_line(
        redis_url: str, queue_name: str, args: list[str], option: str) -> None:
    # Given a queue with a job, and nothing else running
    before = Queue(queue_name, redis_url).submit(["kept"]).id
    # When a command is given NaN or infinity for a number of seconds
    res = runner.invoke(app, [queue_name if a == "KNOWN" else a for a in args],
                        env={"STREAMQ_REDIS_URL": redis_url})
    # Then it stops at once as a usage error: one line naming the option, no traceback
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == ExitCode.USAGE, (res.exit_code, res.stderr, res.exception)
    assert len(lines) == 1 and lines[0].startswith("streamq: "), res.stderr
    assert option in lines[0] and "not a finite number" in lines[0], lines[0]
    # and nothing was submitted or changed: the queue holds its one job
    listed = runner.invoke(app, ["jobs", queue_name, "--json"],
                           env={"STREAMQ_REDIS_URL": redis_url})
    assert [j["job_id"] for j in json.loads(listed.stdout)["jobs"]] == [before]
