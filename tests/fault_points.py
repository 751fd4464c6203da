"""The crash tests' hook: SIGKILL this process at a point of streamq's work.

``STREAMQ_FAULT=point[:n]`` chooses the point (streamq.hooks.POINTS) and on which pass
of it (the first by default). Tests set it with ``STREAMQ_HOOK=tests.fault_points:install``
in a worker's or reaper's environment (conftest's Procs, the fault suite's fleet).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from streamq.base import hooks

HOOK = "tests.fault_points:install"


def kill_at(spec: str) -> Callable[[str], None] | None:
    """A hook that SIGKILLs the process on the n-th pass of the point ``spec`` names
    (``point[:n]``); None for an empty spec."""
    point, _, count = spec.partition(":")
    if not point:
        return None
    if point not in hooks.POINTS:
        raise ValueError(f"STREAMQ_FAULT names no fault point: {point!r}")
    n, seen = int(count or 1), [0]

    def hook(at: str) -> None:
        if at == point:
            seen[0] += 1
            if seen[0] >= n:
                os.kill(os.getpid(), signal.SIGKILL)

    return hook


def install() -> None:
    hooks.install(kill_at(os.environ.get("STREAMQ_FAULT", "")))


def env_with_fault(env: dict[str, str]) -> dict[str, str]:
    """``env``, with the hook named when it sets STREAMQ_FAULT."""
    return {**env, "STREAMQ_HOOK": HOOK} if env.get("STREAMQ_FAULT") else env
