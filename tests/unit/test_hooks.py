"""Hook points of the worker's and the reaper's work, and the crash tests' hook (no server)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from streamq.base import hooks
from streamq.errors import ConfigError
from tests import fault_points


@pytest.fixture(autouse=True)
def no_hook() -> Iterator[None]:
    yield
    hooks.install(None)


def test_a_point_runs_the_installed_hook_and_nothing_without_one() -> None:
    seen: list[str] = []
    assert not hooks.active()
    hooks.at("after_ack")  # no hook: nothing happens
    hooks.install(seen.append)
    assert hooks.active()
    hooks.at("after_ack")
    hooks.at("in_handler")
    assert seen == ["after_ack", "in_handler"]


def test_the_fault_hook_kills_on_the_nth_pass_of_its_point(monkeypatch: pytest.MonkeyPatch) -> None:
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append((pid, sig)))
    hook = fault_points.kill_at("after_read:3")
    assert hook is not None
    for point in ("after_read", "after_ack", "after_read"):
        hook(point)
    assert kills == []
    hook("after_read")
    assert kills == [(os.getpid(), signal.SIGKILL)]
    assert fault_points.kill_at("") is None
    with pytest.raises(ValueError, match="no fault point"):
        fault_points.kill_at("after_lunch")


def test_streamq_hook_names_the_installer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMQ_HOOK", fault_points.HOOK)
    monkeypatch.setenv("STREAMQ_FAULT", "in_handler")
    hooks.install_from_env()
    assert hooks.active()
    monkeypatch.setenv("STREAMQ_HOOK", "tests.fault_points:nothing")
    with pytest.raises(ConfigError, match="names no installer"):
        hooks.install_from_env()
    # a test's environment with a fault point names the hook; one without does not
    assert fault_points.env_with_fault({"STREAMQ_FAULT": "after_ack"})["STREAMQ_HOOK"] \
        == fault_points.HOOK
    assert "STREAMQ_HOOK" not in fault_points.env_with_fault({"A": "1"})
