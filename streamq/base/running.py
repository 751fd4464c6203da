"""The sub-request a handler is running, as a context variable.

The worker sets it around each handler call; :func:`current_task` reads it for the
handler, and tracing reads it to name the handler's span. It stands below both, so
neither imports the other.
"""

from __future__ import annotations

import contextvars
from typing import Any

from streamq.base.models import Task

#: (queue, job id, index, entry id, attempt[, deadline]) of the sub-request being run; a
#: Task is made from it only when a handler asks, not for every sub-request
current: contextvars.ContextVar[tuple[Any, ...] | None] = contextvars.ContextVar(
    "streamq_task", default=None)


def current_task() -> Task | None:
    """The sub-request the calling handler is running (None outside a handler)."""
    fields = current.get()
    return None if fields is None else Task(*fields)
