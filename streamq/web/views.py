"""The dashboard's pages (GET): queues, one queue, jobs, one job, pending entries,
workers, repeats, dead letters and completions. Each reads with the inspector's client."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from streamq.base.keys import check_name
from streamq.base.replies import new_token
from streamq.ops import queue_overview, queue_pending
from streamq.ops.queue_rows import cancelled_held
from streamq.producer import deadletters
from streamq.services.shards import CorruptShards

from ..errors import JobNotFound
from . import jobview, listing
from .backend import Backend, QueueNames, transient
from .pages import NotFound, backend_of, float_param, guarded, int_param, render

log = logging.getLogger("streamq.web")

#: Dead letters shown on one page.
DEAD_PAGE = 100
#: Completion records shown when the feed opens.
FEED_SIZE = 50
#: Active jobs whose pending entries the Pending view reads (oldest first).
PENDING_JOBS = 500



def queue_trends(backend: Backend, shards: list[Any]) -> Any:
    """The queue's charts, read at most every ``trends.REFRESH_S`` and shared by every
    page and live stream."""
    return backend.trends.get(shards)


@guarded
def home(request: Request) -> Response:
    return RedirectResponse("/queues", status_code=303)


@guarded
def queues(request: Request) -> Response:
    """Every queue: counts, state, charts."""
    return render(request, "queues.html", **queue_table(backend_of(request), wait=False))


@dataclass(frozen=True)
class QueueRow:
    """One row of the Queues view: a queue's overview and charts, or why it has none."""

    name: str
    overview: queue_overview.Overview | None = None  #: None: still being read (or a problem)
    trends: Any = None
    #: None, or what is wrong: "name" (the registry holds a name that is no queue
    #: name), "config" (its stored configuration is corrupt), "unreadable"
    problem: str | None = None
    message: str = ""


def queue_table(backend: Backend, *, wait: bool) -> dict[str, Any]:
    """What the Queues table shows: ``rows`` (:func:`queue_rows`) and ``names`` (how
    much of the registry of queues was read)."""
    names = backend.queue_names()
    return {"rows": queue_rows(backend, names, wait=wait), "names": names}


def queue_rows(backend: Backend, names: QueueNames, *, wait: bool) -> list[QueueRow]:
    """A row for every listed queue that has keys, then one for each invalid name.
    ``wait``: read a queue's first overview whole (a live stream); else its overview
    is None when the read takes long (a page shows a placeholder). A queue that cannot
    be shown (its configuration corrupt, its keys unreadable) is a row saying so: one
    queue never fails the page (an error of Redis itself does)."""
    rows = []
    for name in names.valid:
        try:
            shards = backend.shards(name)
            snap = backend.snapshots.get(name) if wait else backend.snapshots.peek(name)
            rows.append(QueueRow(name, snap.overview if snap else None,
                                 queue_trends(backend, shards)))
        except queue_overview.QueueNotFound:
            continue  # named but empty: nothing to show
        except CorruptShards as e:
            rows.append(QueueRow(name, problem="config", message=str(e)))
        except Exception as e:
            if transient(e):
                raise
            log.warning("queue %r cannot be shown: %s", name, e, exc_info=True)
            rows.append(QueueRow(name, problem="unreadable",
                                 message="its keys could not be read as a queue's (the "
                                         "dashboard's log says why)"))
    rows += [QueueRow(name, problem="name",
                      message="the registry of queues holds this name, which is not a "
                              "valid queue name: nothing uses it")
             for name in names.invalid]
    return rows


@guarded
def queue(request: Request) -> Response:
    """One queue: counts by priority, tokens, rate limits, charts, pause and resume."""
    backend = backend_of(request)
    name = request.path_params["queue"]
    shards = backend.require_queue(name)
    snap = backend.snapshots.peek(name)
    return render(request, "queue.html", queue=name, ov=snap.overview if snap else None,
                  trends=queue_trends(backend, shards), age_s=0)


@guarded
def jobs(request: Request) -> Response:
    """A page of the queue's jobs: filters, search, cursor."""
    backend = backend_of(request)
    name = request.path_params["queue"]
    shards = backend.require_queue(name)
    state = request.query_params.get("state") or None
    if state is not None and state not in listing.STATES:
        raise NotFound(f"unknown state {state!r}: one of {', '.join(listing.STATES)}")
    f = listing.JobFilter(
        state=state, client=request.query_params.get("client") or None,
        priority=int_param(request, "priority", 0, 99),
        min_age_s=float_param(request, "min_age"), max_age_s=float_param(request, "max_age"),
        search=(request.query_params.get("search") or "").strip() or None)
    now = queue_overview.server_ms(backend.r, shards[0])
    pg = listing.page(backend.r, shards, f, request.query_params.get("cursor"), now)
    query = {k: v for k, v in request.query_params.items() if k not in ("cursor", "flash",
                                                                         "sig", "outcome")}
    return render(request, "jobs.html", queue=name, page=pg, f=f, states=listing.STATES,
                  query=query, now_ms=now)


def job_detail(backend: Backend, name: str, job_id: str, offset: int = 0,
               limit: int | None = jobview.PREVIEW_CHARS) -> jobview.JobDetail:
    """The job's detail; JobNotFound for an unknown job or one of another queue."""
    check_name("job id", job_id)
    q = backend.queue(name)
    st = q.status(job_id)
    if st.queue != name:
        raise JobNotFound(job_id)
    return jobview.detail(backend.r, q.job_shard(job_id), q.lane_shard(job_id), st, offset,
                          limit)


@guarded
def job(request: Request) -> Response:
    """One job: progress, counts, settings, timeline, sub-requests, dead letters."""
    backend = backend_of(request)
    name, job_id = request.path_params["queue"], request.path_params["job"]
    offset = int_param(request, "offset", 0, 10**9) or 0
    d = job_detail(backend, name, job_id, offset)
    dead = backend.queue(name).dead_letters(count=DEAD_PAGE, job_id=job_id)
    return render(request, "job.html", queue=name, d=d, st=d.status, dead=dead,
                  retry_token=new_token(),
                  page_size=jobview.SUB_PAGE)


@guarded
def sub_request(request: Request) -> Response:
    """One sub-request of a job, its payload, result and error shown whole."""
    backend = backend_of(request)
    name, job_id = request.path_params["queue"], request.path_params["job"]
    index = int(request.path_params["index"])
    d = job_detail(backend, name, job_id, index, limit=None)
    subs = [s for s in d.subs if s.index == index] if index < d.status.total else []
    if not subs:
        raise NotFound(f"job {job_id!r} has no sub-request {index}")
    return render(request, "sub.html", queue=name, st=d.status, sub=subs[0])


@guarded
def pending(request: Request) -> Response:
    """Pending entries by job and consumer (XPENDING), as ``streamq pending`` shows."""
    backend = backend_of(request)
    name = request.path_params["queue"]
    shards = backend.require_queue(name)
    job_id = request.query_params.get("job") or None
    consumer = request.query_params.get("consumer") or None
    if job_id is not None:
        check_name("job id", job_id)
        ids, lanes, only = [job_id], [backend.queue(name).lane_shard(job_id)], [job_id]
        capped = False
    else:
        # the oldest unfinished jobs, those cancelled while their handlers run, and
        # every small job's held entry (in its lane), as `streamq pending` shows
        ids = _oldest_active(backend, shards, PENDING_JOBS)
        capped = len(ids) == PENDING_JOBS
        ids += cancelled_held(backend.r, shards, ids)
        lanes, only = shards, None
    rep = queue_pending.pending(backend.r, shards[0], ids, lanes=lanes, lane_jobs=only,
                                consumer=consumer, details=job_id is not None)
    return render(request, "pending.html", queue=name, rep=rep, job=job_id,
                  consumer=consumer, capped=capped)


def _oldest_active(backend: Backend, shards: list[Any], n: int) -> list[str]:
    """The ``n`` oldest unfinished jobs over every shard (a bounded read of each
    ``active`` registry)."""
    rows: list[tuple[float, str]] = []
    for qk in shards:
        got: Any = backend.r.zrange(qk.active, 0, n - 1, withscores=True)
        rows += [(score, j.decode() if isinstance(j, bytes) else str(j)) for j, score in got]
    return [j for _, j in sorted(rows)[:n]]


@guarded
def workers(request: Request) -> Response:
    """Live and dead workers: heartbeat, leases, counts."""
    backend = backend_of(request)
    name = request.path_params["queue"]
    shards = backend.require_queue(name)
    rows = queue_pending.workers(backend.r, shards[0])
    return render(request, "workers.html", queue=name, workers=rows)


@guarded
def repeats(request: Request) -> Response:
    """The queue's repeating jobs, with pause, resume and remove."""
    from streamq.producer.client import Queue

    backend = backend_of(request)
    name = request.path_params["queue"]
    backend.require_queue(name)
    rows = Queue(name, client=backend.r).repeats.list()
    return render(request, "repeats.html", queue=name, repeats=rows)


@guarded
def dead(request: Request) -> Response:
    """The newest dead letters, with replay and purge."""
    backend = backend_of(request)
    name = request.path_params["queue"]
    shards = backend.require_queue(name)
    q = backend.queue(name)
    job_id = request.query_params.get("job") or None
    if job_id is not None:
        check_name("job id", job_id)
    letters = q.dead_letters(count=DEAD_PAGE, job_id=job_id)
    total = sum(int(backend.r.xlen(qk.dead)) for qk in shards)
    return render(request, "dead.html", queue=name, letters=letters, total=total,
                  job=job_id, rows=[(d, d.as_dict()) for d in letters],
                  preview=jobview.Value.of)


@guarded
def dead_letter(request: Request) -> Response:
    """One dead letter whole."""
    backend = backend_of(request)
    name, dead_id = request.path_params["queue"], request.path_params["dead"]
    backend.require_queue(name)
    q = backend.queue(name)
    raw, sep, k = dead_id.partition("@")
    shards = q.known_shards
    if sep and (not k.isdigit() or not 0 < int(k) < len(shards)):
        raise queue_overview.DeadLetterNotFound(f"no dead letter {dead_id!r} in queue {name!r}")
    qk = shards[int(k)] if sep else shards[0]
    letter = queue_overview.dead_letter(backend.r, qk, raw)
    replayed = deadletters.replayed_into(backend.r, qk, raw)
    return render(request, "dead_letter.html", queue=name, dead_id=dead_id, d=letter,
                  doc=letter.as_dict(), replayed=replayed,
                  payload=jobview.Value.of(letter.as_dict()["payload"], None))


@guarded
def completions(request: Request) -> Response:
    """The latest completion records; the page follows new ones live."""
    backend = backend_of(request)
    name = request.path_params["queue"]
    backend.require_queue(name)
    recs = list(reversed(backend.queue(name).completions(FEED_SIZE)))
    return render(request, "completions.html", queue=name, records=recs)
