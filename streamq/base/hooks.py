"""Named points in the work of workers and reapers, where an installed hook runs.

The points are the moments at which a crash matters to the contract:

- a worker's ``after_claim`` (its settle claimed tokens), ``after_read`` (it read
  entries), ``in_handler`` (a handler is about to run), ``after_ack`` (results were
  acknowledged), ``after_dead_letter`` (an entry was dead-lettered);
- a reaper's ``reaper_mid_pass`` (after the first job, and after the first lane, of a
  pass).

Nothing runs there unless a hook is installed (one check of a module variable). The
crash tests install one that SIGKILLs the process at a chosen point
(``tests/fault_points.py``); a process installs the hook that ``STREAMQ_HOOK``
(``module:function``, the function called with no argument to install it) names when
its worker or reaper is made.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from streamq.errors import ConfigError

__all__ = ["POINTS", "active", "at", "install", "install_from_env"]

POINTS = frozenset({"after_claim", "after_read", "in_handler", "after_ack",
                    "after_dead_letter", "reaper_mid_pass"})

_hook: Callable[[str], None] | None = None


def install(hook: Callable[[str], None] | None) -> None:
    """Run ``hook(point)`` at every point from now on (None: no hook)."""
    global _hook
    _hook = hook


def active() -> bool:
    """Whether a hook is installed (hot loops test this once, not per point)."""
    return _hook is not None


def at(point: str) -> None:
    """The work reached ``point``: run the hook, if any."""
    if _hook is not None:
        _hook(point)


def install_from_env() -> None:
    """Call the installer ``STREAMQ_HOOK`` names (``module:function``), if it is set."""
    spec = os.environ.get("STREAMQ_HOOK", "")
    if not spec:
        return
    module, _, name = spec.partition(":")
    try:
        installer = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"STREAMQ_HOOK={spec!r} names no installer: {e}") from None
    installer()
