"""The dashboard's actions (POST): pause, resume, cancel, change a job's priority or
concurrency, retry or delete a finished job, replay and purge dead letters, pause,
resume and remove a repeat.

Each runs with the admin role's client, is refused in read-only mode (403) and
without a valid CSRF token (403, checked before by the app), answers 303 back to the
page it came from with its outcome, and is idempotent: doing it twice leaves what
doing it once left (a second cancel finds the job cancelled, a replayed dead letter
is not replayed again, a second purge deletes nothing more). Destroying actions need
a confirmation field; without one the app shows a confirmation page.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from streamq.base import config
from streamq.base.keys import check_name
from streamq.producer import deadletters

from ..errors import DeadLetterReplayed, JobNotFound, StreamqError
from .backend import transient
from .pages import back_to, backend_of, error_page, handle, render

log = logging.getLogger("streamq.web")

#: Seconds an action waits for workers to acknowledge a pause or a cancel.
ACK_WAIT_S = 5.0
#: Dead letters replayed at most by one request.
MAX_REPLAY = 1000



async def _form(request: Request) -> dict[str, Any]:
    form = await request.form()
    out: dict[str, Any] = {}
    for k, v in form.multi_items():
        if isinstance(v, str):
            out.setdefault(k, []).append(v)
    return out


def _one(form: dict[str, Any], name: str) -> str | None:
    got = form.get(name)
    return got[0].strip() if got else None


def _confirm(request: Request, form: dict[str, Any], what: str, expected: str = "yes"
             ) -> Response | None:
    """A confirmation page unless the form confirms (``confirm`` = ``expected``)."""
    if _one(form, "confirm") == expected:
        return None
    fields = [(k, v) for k, vs in form.items() if k not in ("csrf", "confirm") for v in vs]
    return render(request, "confirm.html", what=what, action=request.url.path,
                  fields=fields, expected=expected, typed=expected != "yes")


def _run(request: Request, back: str, do: Any) -> Response:
    """Run ``do()`` (its outcome message, or raise); back to ``back`` with it."""
    try:
        message = do()
    except Exception as e:
        if transient(e):
            return handle(request, e)
        if isinstance(e, (JobNotFound, StreamqError)):
            return back_to(request, back, str(e), ok=False)
        return handle(request, e)
    backend_of(request).snapshots.forget(request.path_params.get("queue", ""))
    return back_to(request, back, message)


async def pause(request: Request) -> Response:
    name = request.path_params["queue"]
    back = f"/q/{name}"

    def do() -> str:
        backend_of(request).require_queue(name)
        rep = backend_of(request).admin_queue(name).pause(wait=True, timeout=ACK_WAIT_S)
        if rep.complete:
            return f"queue {name} paused: no worker claims new work"
        return (f"queue {name} paused; {len(rep.waiting)} worker(s) have not acknowledged "
                "yet (they claim nothing new either way)")
    return await _threaded(request, back, do)


async def resume(request: Request) -> Response:
    name = request.path_params["queue"]

    def do() -> str:
        backend_of(request).require_queue(name)
        was = backend_of(request).admin_queue(name).resume()
        return f"queue {name} resumed" if was else f"queue {name} was not paused"
    return await _threaded(request, f"/q/{name}", do)


async def cancel(request: Request) -> Response:
    name, job_id = request.path_params["queue"], request.path_params["job"]
    form = await _form(request)
    asked = _confirm(request, form, f"Cancel job {job_id}? Nothing of it starts any more.")
    if asked is not None:
        return asked

    def do() -> str:
        q = _own_job(request, name, job_id)
        rep = q.cancel(job_id, wait=True, timeout=ACK_WAIT_S)
        if rep.state != "cancelled":
            return f"job {job_id} had ended ({rep.state}): nothing to cancel"
        what = "cancelled" if rep.cancelled else "was cancelled already"
        return f"job {job_id} {what}" + ("" if rep.complete else
                                         "; workers still finishing what they started")
    return await _threaded(request, f"/q/{name}/jobs/{job_id}", do)


async def settings(request: Request) -> Response:
    name, job_id = request.path_params["queue"], request.path_params["job"]
    form = await _form(request)

    def number(field: str, lo: int, hi: int) -> int | None:
        raw = _one(form, field)
        if not raw:
            return None
        if not raw.isdigit() or not lo <= int(raw) <= hi:
            raise StreamqError(f"{field} must be a whole number from {lo} to {hi}, got {raw!r}")
        return int(raw)

    def do() -> str:
        prio = number("priority", 0, config.MAX_PRIORITY)
        conc = number("concurrency", 1, config.MAX_CONCURRENCY)
        if prio is None and conc is None:
            raise StreamqError("give a priority or a concurrency")
        q = _own_job(request, name, job_id)
        st = q.reprioritize(job_id, priority=prio, concurrency=conc)
        return f"job {job_id}: priority {st.priority}, concurrency {st.concurrency}"
    return await _threaded(request, f"/q/{name}/jobs/{job_id}", do)


async def replay(request: Request) -> Response:
    name = request.path_params["queue"]
    form = await _form(request)
    ids = [i.strip() for i in form.get("id", []) if i.strip()][:MAX_REPLAY]
    back = _one(form, "back") or f"/q/{name}/dead"
    if not back.startswith(f"/q/{name}/"):
        back = f"/q/{name}/dead"

    def do() -> str:
        if not ids:
            raise StreamqError("select the dead letters to replay")
        q = backend_of(request).admin_queue(name)
        done, already = [], []
        for dead_id in ids:
            try:
                done.append(f"{dead_id} into job {q.replay_dead(dead_id, token=dead_id)}")
            except DeadLetterReplayed as e:
                already.append(f"{dead_id} (into job {e.target})" if e.target else dead_id)
        parts = []
        if done:
            parts.append("replayed " + "; ".join(done))
        if already:
            parts.append("replayed before: " + "; ".join(already))
        return ". ".join(parts)
    return await _threaded(request, back, do)


async def purge(request: Request) -> Response:
    name = request.path_params["queue"]
    form = await _form(request)
    asked = _confirm(request, form, f"Delete every dead letter of queue {name}? Type the "
                                    "queue's name to confirm.", expected=name)
    if asked is not None:
        return asked

    def do() -> str:
        q = backend_of(request).admin_queue(name)
        backend_of(request).require_queue(name)
        n = sum(deadletters.purge(q.redis, qk) for qk in q.known_shards)
        return f"purged {n} dead letters" if n else "no dead letters to purge"
    return await _threaded(request, f"/q/{name}/dead", do)


async def retry(request: Request) -> Response:
    """Retry a failed job's dead-lettered sub-requests in place (the form's token makes
    a resent form do nothing more)."""
    name, job_id = request.path_params["queue"], request.path_params["job"]
    form = await _form(request)
    token = _one(form, "token") or None

    def do() -> str:
        q = _own_job(request, name, job_id)
        n = q.retry(job_id, token=check_name("retry token", token) if token else None)
        return f"job {job_id}: {n} sub-request(s) run again"
    return await _threaded(request, f"/q/{name}/jobs/{job_id}", do)


async def delete(request: Request) -> Response:
    """Delete a finished job's records now (asks first)."""
    name, job_id = request.path_params["queue"], request.path_params["job"]
    form = await _form(request)
    asked = _confirm(request, form, f"Delete job {job_id}? Its status, results and errors "
                                    "go now; its completion record and dead letters stay.")
    if asked is not None:
        return asked

    def do() -> str:
        _own_job(request, name, job_id).delete(job_id)
        return f"job {job_id} deleted"
    return await _threaded(request, f"/q/{name}/jobs", do)


def _own_job(request: Request, name: str, job_id: str) -> Any:
    """The admin's queue client, once ``job_id`` is a job of queue ``name``."""
    q = backend_of(request).admin_queue(name)
    if q.status(check_name("job id", job_id)).queue != name:
        raise JobNotFound(job_id)
    return q


async def repeat(request: Request) -> Response:
    """Pause, resume or remove one repeat (remove asks first)."""
    name, rep, what = (request.path_params[k] for k in ("queue", "repeat", "what"))
    if what not in ("pause", "resume", "remove"):
        return error_page(request, 404, "Not found", f"no action {what!r} on a repeat")
    form = await _form(request)
    if what == "remove":
        asked = _confirm(request, form, f"Remove repeat {rep}? No tick submits its job any "
                                        "more; the jobs it submitted stay.")
        if asked is not None:
            return asked

    def do() -> str:
        backend_of(request).require_queue(name)
        repeats = backend_of(request).admin_queue(name).repeats
        done = {"pause": "paused", "resume": "resumed", "remove": "removed"}[what]
        changed = getattr(repeats, what)(check_name("repeat name", rep))
        return f"repeat {rep} {done}" if changed else f"repeat {rep} was {done} already"
    return await _threaded(request, f"/q/{name}/repeats", do)


async def _threaded(request: Request, back: str, do: Any) -> Response:
    from starlette.concurrency import run_in_threadpool
    if backend_of(request).settings.read_only:
        return error_page(request, 403, "Read-only", "This dashboard runs in read-only mode: "
                                                     "actions are refused.")
    return await run_in_threadpool(_run, request, back, do)
