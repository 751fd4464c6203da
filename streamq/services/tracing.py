"""OpenTelemetry tracing, the optional extra ``streamq[otel]``.

Every use of OpenTelemetry is in this module, and it imports OpenTelemetry only
once tracing is on: without the extra, or with tracing off, nothing here is
imported by the core and no span is made. Tracing is on for a Queue or Worker
when its ``tracing`` option says so; without the option, when ``STREAMQ_TRACING``
is ``1`` (``0`` turns it off); without either, when OpenTelemetry is imported and
a tracer provider other than the default one is set (the application, or
``opentelemetry-instrument``, configured tracing).

Producer: a ``streamq.submit`` span (kind PRODUCER) around each submit. While one
is current (or any other valid span), the scripts that write entries add the
span's W3C ``traceparent`` to each entry, in field ``c`` (:func:`entry_context`).

Worker: for each sub-request run, three spans in the submitter's trace (children
of the span whose context the entry carries): ``streamq.wait`` from the entry's
enqueue (the ms part of its id, Redis's clock) to the handler's start,
``streamq.handler`` (kind CONSUMER, current while the handler runs, so its own
spans nest under it; an exception is recorded and sets status ERROR), and
``streamq.ack`` from the handler's end to the acknowledgement that stored the
result (results are acknowledged in batches). An entry that carries no context
starts a trace of its own at its wait span.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from streamq.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, TracerProvider

#: True once a Queue or Worker of this process traces: the calls that write entries
#: then ask :func:`entry_context` (one check per call, none per entry)
ACTIVE = False
#: set inside a traced submit (its span current): entries written then carry its context
_SUBMITTING: contextvars.ContextVar[bool] = contextvars.ContextVar("streamq_submitting",
                                                                  default=False)
#: the entry field that carries the submitter's trace context (a W3C traceparent)
FIELD = b"c"
#: most entry contexts and finished handlers kept waiting for their run or ack
_KEEP = 50_000
#: an entry as the worker's tracer knows it: (job id, entry id)
EntryKey = tuple[str, str]
F = TypeVar("F", bound=Callable[..., Any])
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def wanted(option: bool | TracerProvider | None) -> bool:
    """Whether tracing is on, from the ``tracing`` option, else ``STREAMQ_TRACING``,
    else whether an application set a tracer provider (see the module's text).
    ConfigError when it is asked for and OpenTelemetry is not installed."""
    if option is not None and not isinstance(option, bool):
        return True  # a tracer provider
    if option is None:
        env = os.environ.get("STREAMQ_TRACING", "").strip().lower()
        if env in _ON:
            option = True
        elif env in _OFF:
            option = False
        elif env:
            raise ConfigError(f"STREAMQ_TRACING must be 1 or 0, got {env!r}")
    if option is None:
        if sys.modules.get("opentelemetry.trace") is None:
            return False  # nobody imported OpenTelemetry: no provider can be set
        try:
            from opentelemetry import trace
        except ImportError:
            return False
        return not _default_provider(trace.get_tracer_provider())
    if option:
        try:
            import opentelemetry.trace  # noqa: F401
        except ImportError:
            raise ConfigError("tracing needs OpenTelemetry: pip install 'streamq[otel]'") from None
    return bool(option)


def _default_provider(provider: Any) -> bool:
    from opentelemetry import trace
    return isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _ensure_provider() -> None:
    """Tracing asked for but no provider set: set the SDK's, exporting as the standard
    ``OTEL_*`` variables say (``OTEL_TRACES_EXPORTER`` otlp, the default, console or
    none; ``OTEL_SERVICE_NAME``, default streamq; the OTLP exporter's own variables)."""
    from opentelemetry import trace
    if not _default_provider(trace.get_tracer_provider()):
        return
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
    except ImportError:
        raise ConfigError("tracing with no tracer provider set needs the OpenTelemetry SDK: "
                          "pip install 'streamq[otel]'") from None
    names = [n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")
             if n.strip() and n.strip() != "none"]
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter
            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            exporters.append(_otlp_exporter())
        else:
            raise ConfigError(f"OTEL_TRACES_EXPORTER {name!r}: streamq knows otlp, console, none")
    if "OTEL_SERVICE_NAME" not in os.environ:
        resource = Resource.create({"service.name": "streamq"})
    else:
        resource = Resource.create()
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def _otlp_exporter() -> Any:
    grpc = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                          os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")) == "grpc"
    module = f"opentelemetry.exporter.otlp.proto.{'grpc' if grpc else 'http'}.trace_exporter"
    try:
        return importlib.import_module(module).OTLPSpanExporter()
    except ImportError:
        raise ConfigError("OTEL_TRACES_EXPORTER=otlp needs pip install "
                          "opentelemetry-exporter-otlp (or set it to console or none)") from None


def _tracer(option: bool | TracerProvider | None) -> Any:
    global ACTIVE
    ACTIVE = True
    if option is not None and not isinstance(option, bool):
        return option.get_tracer("streamq")
    _ensure_provider()
    from opentelemetry import trace
    return trace.get_tracer("streamq")


def entry_context() -> str:
    """The W3C traceparent of the current span inside a traced submit, "" elsewhere
    (tracing off, or no valid span): what an entry written now carries in field ``c``."""
    if not ACTIVE or not _SUBMITTING.get():
        return ""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    if not trace.get_current_span().get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent", "")


def _extract(traceparent: str) -> Context:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


# -- producer -------------------------------------------------------------------------


class SubmitTracer:
    """A Queue's tracer: a span around each submit."""

    def __init__(self, option: bool | TracerProvider | None = None) -> None:
        self.tracer = _tracer(option)

    @contextmanager
    def submit(self, queue: str, operation: str, **attributes: Any) -> Iterator[Span]:
        from opentelemetry.trace import SpanKind
        with self.tracer.start_as_current_span(
                "streamq.submit", kind=SpanKind.PRODUCER,
                attributes={"streamq.queue": queue, "streamq.operation": operation,
                            **attributes}) as span:
            yield span


def submit_tracer(option: bool | TracerProvider | None) -> SubmitTracer | None:
    """The tracer of a Queue, None when tracing is off."""
    return SubmitTracer(option) if wanted(option) else None


def traced_submit(operation: str, *, job: bool = False) -> Callable[[F], F]:
    """Decorate a Queue method (a StreamingJob's with ``job``): with tracing on, it runs
    inside a ``streamq.submit`` span that names the job (or the number of jobs) it made.
    With tracing off it costs one attribute check per call."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def inner(self: Any, *args: Any, **kwargs: Any) -> Any:
            q = self.queue if job else self
            tracer: SubmitTracer | None = q.tracer
            if tracer is None:
                return fn(self, *args, **kwargs)
            extra = {"streamq.job_id": self.id} if job else {}
            with tracer.submit(q.name, operation, **extra) as span:
                token = _SUBMITTING.set(True)
                try:
                    out = fn(self, *args, **kwargs)
                finally:
                    _SUBMITTING.reset(token)
                if isinstance(out, list):
                    span.set_attribute("streamq.count", len(out))
                elif hasattr(out, "id"):
                    span.set_attribute("streamq.job_id", out.id)
                return out

        return cast(F, inner)

    return deco


# -- worker ---------------------------------------------------------------------------


class WorkerTracer:
    """A Worker's tracer: wait, handler and ack spans for each sub-request run.

    The slots note the contexts of the entries they read (:meth:`note`, one call per
    read, only when tracing is on); the handler, wrapped by :meth:`wrap`, makes the
    wait and handler spans of the sub-request it runs (the one ``current_task`` names);
    :meth:`acked` makes the ack spans once the results are stored."""

    def __init__(self, worker_id: str, option: bool | TracerProvider | None = None) -> None:
        self.tracer = _tracer(option)
        self.worker_id = worker_id
        # entries are known by (job id, entry id): an entry id is unique in its stream
        # only, and a big job's stream and a small-job lane may give the same id
        #: entry -> the traceparent it carries (read, not yet run)
        self.parents: dict[EntryKey, str] = {}
        #: entry -> (context, attributes, handler end ns) of a result awaiting its ack
        self.pending: dict[EntryKey, tuple[Context, dict[str, Any], int]] = {}
        #: entry -> the traceparent of an entry whose handler failed (for its retry)
        self.failing: dict[EntryKey, str] = {}

    def note(self, keys: Sequence[EntryKey], flats: Iterable[list[bytes]]) -> None:
        """Keep the trace context of entries just read (``keys``: their job and entry
        ids; ``flats``: their field lists)."""
        parents = self.parents
        if len(parents) > _KEEP:
            parents.clear()  # contexts of entries never run (reclaimed elsewhere, drained)
        for key, flat in zip(keys, flats):
            for k in range(len(flat) - 2, -1, -2):  # the context is written last
                if flat[k] == FIELD:
                    parents[key] = flat[k + 1].decode("ascii", "replace")
                    break

    def wrap(self, handler: Callable[..., Any]) -> Callable[..., Any]:
        """``handler`` with spans around each call made for a sub-request."""
        from opentelemetry import trace

        from streamq.base.running import current as _current

        use_span = trace.use_span

        if inspect.iscoroutinefunction(handler):
            @functools.wraps(handler)
            async def traced_async(payload: Any) -> Any:
                task = _current.get()
                if task is None:
                    return await handler(payload)
                span, ctx, attrs, parent = self._begin(task)
                try:
                    with use_span(span, end_on_exit=False, record_exception=False,
                                  set_status_on_exception=False):
                        value = await handler(payload)
                except BaseException as e:
                    self._failed(span, (task[1], task[3]), parent, e)
                    raise
                self._ran(span, (task[1], task[3]), ctx, attrs)
                return value

            return traced_async

        @functools.wraps(handler)
        def traced(payload: Any) -> Any:
            task = _current.get()
            if task is None:
                return handler(payload)
            span, ctx, attrs, parent = self._begin(task)
            try:
                with use_span(span, end_on_exit=False, record_exception=False,
                              set_status_on_exception=False):
                    value = handler(payload)
            except BaseException as e:
                self._failed(span, (task[1], task[3]), parent, e)
                raise
            self._ran(span, (task[1], task[3]), ctx, attrs)
            return value

        return traced

    def _begin(self, task: tuple[str, str, int, str, int]
               ) -> tuple[Span, Context, dict[str, Any], str | None]:
        """The wait span (ended now) and the handler span (started now) of ``task``, the
        handler span's parent context, the spans' attributes and the entry's context."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        queue, job, index, eid, attempt = task
        attrs = {"streamq.queue": queue, "streamq.job_id": job, "streamq.index": index,
                 "streamq.entry_id": eid, "streamq.attempt": attempt,
                 "streamq.worker_id": self.worker_id}
        now = time.time_ns()
        try:
            enqueued = min(int(eid[:eid.find("-")]) * 1_000_000, now)
        except ValueError:
            enqueued = now
        parent = self.parents.pop((job, eid), None)
        ctx = _extract(parent) if parent else None
        wait = self.tracer.start_span("streamq.wait", context=ctx, attributes=attrs,
                                      start_time=enqueued)
        wait.end(end_time=now)
        if ctx is None or not trace.get_current_span(ctx).get_span_context().is_valid:
            ctx = trace.set_span_in_context(wait)  # no submitter context: the wait is the root
        span = self.tracer.start_span("streamq.handler", context=ctx, kind=SpanKind.CONSUMER,
                                      attributes=attrs, start_time=now)
        return span, ctx, attrs, parent

    def _ran(self, span: Span, key: EntryKey, ctx: Context, attrs: dict[str, Any]) -> None:
        end = time.time_ns()
        span.end(end_time=end)
        if len(self.pending) > _KEEP:
            self.pending.clear()  # results that never got acknowledged (failed to encode)
        self.pending[key] = (ctx, attrs, end)

    def _failed(self, span: Span, key: EntryKey, parent: str | None, e: BaseException
                ) -> None:
        from opentelemetry.trace import Status, StatusCode
        span.record_exception(e)
        span.set_status(Status(StatusCode.ERROR, f"{type(e).__name__}: {e}"))
        span.end()
        if parent:  # the retry stays in the submitter's trace
            if len(self.failing) > _KEEP:
                self.failing.clear()
            self.failing[key] = parent

    def retry_context(self, job: str, eid: str) -> str:
        """The trace context a failed entry's retry carries ("" for none)."""
        return self.failing.pop((job, eid), "")

    def acked(self, keys: Iterable[EntryKey]) -> None:
        """The ack spans of results just acknowledged."""
        now = time.time_ns()
        pending, start = self.pending, self.tracer.start_span
        for key in keys:
            got = pending.pop(key, None)
            if got is not None:
                ctx, attrs, ended = got
                start("streamq.ack", context=ctx, attributes=attrs,
                      start_time=min(ended, now)).end(end_time=now)


def worker_tracer(option: bool | TracerProvider | None, worker_id: str) -> WorkerTracer | None:
    """The tracer of a Worker, None when tracing is off."""
    return WorkerTracer(worker_id, option) if wanted(option) else None
