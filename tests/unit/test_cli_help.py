"""The command line's help reads as Unix tools print it, completion scripts come out,
and the root's options stand anywhere in the line (in process, no server)."""

from __future__ import annotations

import re
from typing import Any

import typer
from typer.testing import CliRunner

from streamq.cli import app
from streamq.cli.common import hoist_root_options

runner = CliRunner()


def _paths(cmd: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for name, sub in getattr(cmd, "commands", {}).items():
        if not getattr(sub, "hidden", False):
            out += _paths(sub, (*prefix, name))
    return out


def test_every_commands_help_names_its_placeholders_in_capitals() -> None:
    paths = _paths(typer.main.get_command(app))
    assert len(paths) > 25  # every command and sub-command, the root too
    for path in paths:
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "100"})
        assert res.exit_code == 0, (path, res.output)
        text = res.output
        # no type names in angle brackets, no {queue}-style usage
        assert not re.search(r"<(str|int|float|bool|list|path|int range|float range)", text), \
            (path, text)
        usage = text.splitlines()[0]
        assert "{" not in usage and usage.startswith("Usage: streamq"), (path, usage)
        # an environment variable is named once, in full (not cut at the line's end)
        assert "(env " not in text, (path, text)
        for var in set(re.findall(r"STREAMQ_[A-Z_]+", text)):
            assert text.count(f"env var: {var}") <= 1, (path, var)


def test_submit_help_reads_queue_payloads_and_numbers() -> None:
    text = runner.invoke(app, ["submit", "--help"], env={"COLUMNS": "100"}).output
    assert text.splitlines()[0] == "Usage: streamq submit [OPTIONS] QUEUE [PAYLOADS]..."
    for opt in ("--priority N", "--delay SECONDS", "--redis-url URL", "--job-id ID",
                "--file PATH", "--at TIME"):
        assert opt in text, opt


def test_a_completion_script_comes_out_and_completes_commands() -> None:
    res = runner.invoke(app, ["--show-completion", "bash"])
    assert res.exit_code == 0 and "_STREAMQ_COMPLETE=complete_bash" in res.output, res.output


def test_the_roots_own_options_move_before_the_command() -> None:
    assert hoist_root_options(["status", "q", "--cluster"]) == ["--cluster", "status", "q"]
    assert hoist_root_options(["status", "q", "--wait-replicas", "1", "--json"]) == \
        ["--wait-replicas", "1", "status", "q", "--json"]
    assert hoist_root_options(["worker", "q", "--wait-replicas=2", "--no-cluster"]) == \
        ["--wait-replicas=2", "--no-cluster", "worker", "q"]
    # nothing after "--" moves: a payload may read like an option
    assert hoist_root_options(["submit", "q", "--", "--cluster"]) == \
        ["submit", "q", "--", "--cluster"]
