"""Named tasks on a queue: a decorator that registers functions by name, a
``delay``/``submit`` call that sends one, and the worker's handler that routes each
sub-request to its task by name.

    tasks = Tasks("images")

    @tasks.task
    def resize(path: str, size: int = 128) -> dict:
        ...

    job = resize.delay("a.png", size=64)      # a job of one sub-request
    job.wait()

    $ streamq worker images --handler app:tasks

A task's sub-request is the JSON object ``{"task": NAME, "args": [...],
"kwargs": {...}}`` (docs/wire-format.md), so a producer in any language can send
one. The worker checks each call against the task's signature before it runs it:
an unknown name or arguments the function does not take are dead-lettered at once
(NonRetryable), with an error that names what this worker serves. Every worker of
a queue should serve the same tasks: a sub-request goes to whichever worker takes
it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from streamq.base.keys import check_name
from streamq.errors import ConfigError, NonRetryable
from streamq.producer.client import Job, Queue
from streamq.storage.connection import Client

__all__ = ["NamedTask", "Tasks", "envelope"]


def envelope(name: str, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    """The sub-request of one call of task ``name``."""
    return {"task": name, "args": list(args), "kwargs": dict(kwargs or {})}


class NamedTask:
    """One registered function: call it to run it here, ``delay`` or ``submit`` to send
    it to the queue's workers."""

    def __init__(self, tasks: Tasks, name: str, fn: Callable[..., Any],
                 options: dict[str, Any]) -> None:
        self.tasks, self.name, self.fn, self.options = tasks, name, fn, options
        self.signature = inspect.signature(fn)
        self.__doc__ = fn.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function here, as a plain call."""
        return self.fn(*args, **kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> Job:
        """Send one call with these arguments, with the task's job options."""
        return self.submit(args, kwargs)

    def submit(self, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
               **job_options: Any) -> Job:
        """Send one call; ``job_options`` (priority, client, max_deliveries, delay, at,
        timeout, dedup_key, job_id, ...: :meth:`streamq.Queue.submit`) over the task's
        own. Arguments the function does not take raise ConfigError and send nothing."""
        self.check(args, kwargs or {})
        return self.tasks.queue.submit([envelope(self.name, args, kwargs)],
                                       **{**self.options, **job_options})

    def check(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise ConfigError(f"task {self.name!r}{self.signature}: {e}") from None

    def __repr__(self) -> str:
        return f"<NamedTask {self.name!r} of queue {self.tasks.queue.name!r}>"


class Tasks:
    """The named tasks of one queue, and the handler that runs them on a worker
    (``streamq worker QUEUE --handler module:tasks``)."""

    def __init__(self, queue: str | Queue, url: str | None = None, *,
                 client: Client | None = None) -> None:
        self.queue = queue if isinstance(queue, Queue) else Queue(queue, url, client=client)
        self.registry: dict[str, NamedTask] = {}

    def task(self, fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
             **job_options: Any) -> NamedTask | Callable[[Callable[..., Any]], NamedTask]:
        """Register ``fn`` under ``name`` (default: its own name), with default job
        options for its calls (``priority=0``, ``max_deliveries=3``, ...)."""
        def register(f: Callable[..., Any]) -> NamedTask:
            key = check_name("task name", name or str(getattr(f, "__name__", "")))
            if key in self.registry and self.registry[key].fn is not f:
                raise ConfigError(f"task {key!r} is registered already "
                                  f"({self.registry[key].fn!r})")
            t = NamedTask(self, key, f, job_options)
            self.registry[key] = t
            return t
        return register if fn is None else register(fn)

    @property
    def names(self) -> list[str]:
        return sorted(self.registry)

    def __call__(self, payload: Any) -> Any:
        """Run the task a sub-request names: the worker's handler."""
        if not (isinstance(payload, dict) and isinstance(payload.get("task"), str)):
            raise NonRetryable(f"not a task call (a JSON object with a \"task\" name): "
                               f"{str(payload)[:200]}")
        name = payload["task"]
        t = self.registry.get(name)
        if t is None:
            raise NonRetryable(f"unknown task {name!r}: this worker serves "
                               f"{', '.join(self.names) or 'no task'}")
        args, kwargs = payload.get("args", []), payload.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise NonRetryable(f"task {name!r}: \"args\" must be a list and \"kwargs\" an "
                               "object")
        try:
            t.check(args, kwargs)
        except ConfigError as e:
            raise NonRetryable(str(e)) from None
        value = t.fn(*args, **kwargs)
        if inspect.iscoroutine(value):  # an async def task, run to its end here
            value = asyncio.run(value)
        return value

    def __repr__(self) -> str:
        return f"<Tasks of queue {self.queue.name!r}: {', '.join(self.names) or 'none'}>"
