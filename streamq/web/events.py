"""Live updates over Server-Sent Events.

Each stream sends ``update`` events whose data is JSON ``{"targets": {element id:
html}}``: pieces of the page rendered by the same templates as the page (so escaped
the same way); the page's script puts each in place. The completions stream sends
``append`` events with new feed items. A piece is sent only when it changed. A lost
Redis sends an ``unavailable`` event and the stream keeps trying; a stream ends
after :data:`STREAM_LIFE_S` (the browser reconnects by itself) or when its job ended.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from streamq.base.keys import check_name
from streamq.base.models import Completion, JobState

from .backend import transient
from .pages import backend_of, fragment, handle
from .views import job_detail, queue_table, queue_trends

log = logging.getLogger("streamq.web")

#: Seconds between two reads of a stream.
PERIOD_S = 1.0
JOB_PERIOD_S = 0.5
#: Seconds a stream lives before the browser is made to reconnect.
STREAM_LIFE_S = 300.0
#: Completion records sent at most per event.
FEED_BATCH = 100



def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n"


def _stream(request: Request, read: Callable[[], tuple[str, dict[str, Any]] | None],
            period: float) -> Response:
    """An event stream sending what ``read`` (run in a thread) returns when it changed;
    ``read`` returns None to end the stream."""

    async def gen() -> AsyncIterator[str]:
        end = time.monotonic() + STREAM_LIFE_S
        last: str | None = None
        yield "retry: 2000\n\n"
        while time.monotonic() < end and not await request.is_disconnected():
            try:
                got = await run_in_threadpool(read)
            except Exception as e:
                if not transient(e):
                    log.warning("event stream %s failed: %s", request.url.path, e)
                got = ("unavailable", {"message": "Redis is unavailable: the page updates "
                                                  "again when it returns"})
            if got is None:
                yield _event("end", {})  # the page's script closes the stream
                return
            text = _event(*got)
            if text != last:
                yield text
                last = text
            else:
                yield ": idle\n\n"  # a comment: keeps proxies from closing the stream
            await asyncio.sleep(period)

    return StreamingResponse(gen(), media_type="text/event-stream",
                             headers={"cache-control": "no-store",
                                      "x-accel-buffering": "no"})


def queues(request: Request) -> Response:
    backend = backend_of(request)

    def read() -> tuple[str, dict[str, Any]]:
        return "update", {"targets": {"queues-live": fragment(
            "_queues_table.html", **queue_table(backend, wait=True))}}
    return _stream(request, read, PERIOD_S)


def queue(request: Request) -> Response:
    backend = backend_of(request)
    name = request.path_params["queue"]
    try:
        check_name("queue name", name)
    except Exception as e:
        return handle(request, e)

    def read() -> tuple[str, dict[str, Any]]:
        snap = backend.snapshots.get(name)
        trends = queue_trends(backend, backend.shards(name))
        return "update", {"targets": {"queue-live": fragment(
            "_queue_live.html", queue=name, ov=snap.overview, trends=trends)}}
    return _stream(request, read, PERIOD_S)


def job(request: Request) -> Response:
    backend = backend_of(request)
    name, job_id = request.path_params["queue"], request.path_params["job"]
    try:
        offset = max(0, int(request.query_params.get("offset") or 0))
    except ValueError:
        offset = 0
    ended: list[float] = []

    def read() -> tuple[str, dict[str, Any]] | None:
        if ended and time.monotonic() - ended[0] > 2 * JOB_PERIOD_S:
            return None  # the job ended: its last state was sent
        d = job_detail(backend, name, job_id, offset)
        if d.status.terminal and not ended:
            ended.append(time.monotonic())
        return "update", {"targets": {
            "job-live": fragment("_job_live.html", queue=name, d=d, st=d.status),
            "job-subs": fragment("_job_subs.html", queue=name, d=d, st=d.status,
                                 page_size=100)}}
    return _stream(request, read, JOB_PERIOD_S)


def completions(request: Request) -> Response:
    """New completion records after the newest the page showed (by Redis's clock)."""
    backend = backend_of(request)
    name = request.path_params["queue"]
    try:
        check_name("queue name", name)
        after = int(request.query_params.get("after") or 0)
    except Exception as e:
        return handle(request, e)
    seen: dict[str, str] = {}  # shard tag -> last stream id sent

    def read() -> tuple[str, dict[str, Any]]:
        q = backend.queue(name)
        new: list[tuple[tuple[int, ...], Completion]] = []
        for qk in q.known_shards:
            # a record's finished time and its entry id may be a tick apart, and a
            # reconnecting browser asks again from its page's ``after``: start a second
            # early; the page drops a record it shows already (one per job)
            start = f"({seen[qk.tag]}" if qk.tag in seen else str(max(0, after - 1000))
            entries: Any = backend.r.xrange(qk.events, start, "+", count=FEED_BATCH)
            for entry_id, f in entries:
                eid = entry_id.decode()
                seen[qk.tag] = eid
                d = {k.decode(): v.decode() for k, v in f.items()}
                new.append((tuple(int(x) for x in eid.split("-")), Completion(
                    d["job"], name, JobState(d["state"]), int(d["total"]), int(d["done"]),
                    int(d["failed"]), int(d["finished"]))))
        new.sort(key=lambda e: e[0])
        html = fragment("_feed_items.html", queue=name, records=[c for _, c in reversed(new)])
        return "append", {"target": "feed", "html": html, "count": len(new)}
    return _stream(request, read, PERIOD_S)
