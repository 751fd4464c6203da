"""Handlers for the benchmark's worker subprocesses."""

from __future__ import annotations

from typing import Any


def echo(payload: Any) -> Any:
    """Return the payload: the cheapest handler, so the queue itself is measured."""
    return payload
