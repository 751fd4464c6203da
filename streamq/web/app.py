"""The dashboard application: routes, and the gate every request passes.

The gate (an ASGI middleware) lets through only signed-in requests (except the sign-in
page, the health check and the static files), refuses every POST in read-only mode
and every POST without a valid CSRF token or sent by another site, and adds the
security headers to every answer. ``create_app(WebSettings(...))`` builds it;
``streamq web`` serves it with uvicorn.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import actions, events, views
from .backend import Backend, WebSettings, transient
from .pages import HERE, backend_of, error_page, render
from .security import CSRF_COOKIE, HEADERS, OPEN_PATHS, SESSION_COOKIE, Guard, same_origin

__all__ = ["WebSettings", "create_app"]

#: Largest request body read (forms), bytes.
MAX_BODY = 1 << 20


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _cookies(headers: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in headers.get("cookie", "").split(";"):
        k, sep, v = part.strip().partition("=")
        if sep:
            out[k] = v
    return out


class Gate:
    """Authentication, CSRF, read-only mode and security headers, for every request."""

    def __init__(self, app: ASGIApp, guard: Guard, read_only: bool) -> None:
        self.app, self.guard, self.read_only = app, guard, read_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        send = _with_headers(send)  # the security headers, on refusals too
        path: str = scope["path"]
        headers = _headers(scope)
        cookies = _cookies(headers)
        request = Request(scope, receive)
        if not path.startswith(OPEN_PATHS) and not self.guard.authenticated(headers, cookies):
            await self._refuse_auth(request, headers)(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD") and path != "/login":
            body = await _read_body(receive)
            if body is None:
                await error_page(request, 413, "Too large", "The form is too large.")(
                    scope, receive, send)
                return
            refusal = self._check_post(request, headers, cookies, body)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
            receive = _replay(body)
        await self.app(scope, receive, send)

    def _refuse_auth(self, request: Request, headers: dict[str, str]) -> Response:
        if self.guard.basic is not None:
            return PlainTextResponse("authentication required", status_code=401,
                                     headers={"www-authenticate": 'Basic realm="streamq"'})
        if "text/html" in headers.get("accept", "") and request.method == "GET":
            return RedirectResponse("/login", status_code=303)
        return PlainTextResponse("authentication required", status_code=401)

    def _check_post(self, request: Request, headers: dict[str, str], cookies: dict[str, str],
                    body: bytes) -> Response | None:
        if self.read_only:
            return error_page(request, 403, "Read-only", "This dashboard runs in read-only "
                                                         "mode: actions are refused.")
        if not same_origin(headers):
            return error_page(request, 403, "Refused", "This action came from another site.")
        form = parse_qs(body.decode("latin-1"), keep_blank_values=True)
        given = form.get("csrf", [""])[0]
        if not self.guard.csrf_ok(cookies.get(CSRF_COOKIE, ""), given):
            return error_page(request, 403, "Refused", "The form's CSRF token is missing or "
                                                       "wrong: reload the page and try again.")
        return None


async def _read_body(receive: Receive) -> bytes | None:
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return body
        body += bytes(message.get("body", b""))
        if len(body) > MAX_BODY:
            return None
        if not message.get("more_body", False):
            return body


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}
    return receive


def _with_headers(send: Send) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            have = {k.lower() for k, _ in message.get("headers", [])}
            extra = [(k.encode(), v.encode()) for k, v in HEADERS.items() if k.encode() not in have]
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)
    return wrapped


async def login(request: Request) -> Response:
    guard: Guard = request.app.state.guard
    if guard.token is None:
        return RedirectResponse("/queues", status_code=303)
    error = None
    if request.method == "POST":
        form = await request.form()
        token = str(form.get("token") or "")
        if guard.check_token(token.strip()):
            resp = RedirectResponse("/queues", status_code=303)
            resp.set_cookie(SESSION_COOKIE, guard.session_value(), httponly=True,
                            samesite="strict", secure=request.url.scheme == "https")
            return resp
        error = "That token is not right."
    return render(request, "login.html", status=401 if error else 200, error=error)


def healthz(request: Request) -> Response:
    backend = backend_of(request)
    try:
        backend.r.ping()
    except Exception as e:
        if transient(e):
            return PlainTextResponse("redis unavailable", status_code=503)
        raise
    return PlainTextResponse("ok")


def _routes() -> list[Any]:
    q = "/q/{queue}"
    return [
        Route("/", views.home),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/healthz", healthz),
        Route("/queues", views.queues),
        Route("/events/queues", events.queues),
        Route(q, views.queue),
        Route(q + "/jobs", views.jobs),
        Route(q + "/jobs/{job}", views.job),
        Route(q + "/jobs/{job}/sub/{index:int}", views.sub_request),
        Route(q + "/pending", views.pending),
        Route(q + "/workers", views.workers),
        Route(q + "/repeats", views.repeats),
        Route(q + "/repeats/{repeat}/{what:str}", actions.repeat, methods=["POST"]),
        Route(q + "/dead", views.dead),
        Route(q + "/dead/{dead}", views.dead_letter),
        Route(q + "/completions", views.completions),
        Route(q + "/events/queue", events.queue),
        Route(q + "/events/jobs/{job}", events.job),
        Route(q + "/events/completions", events.completions),
        Route(q + "/pause", actions.pause, methods=["POST"]),
        Route(q + "/resume", actions.resume, methods=["POST"]),
        Route(q + "/jobs/{job}/cancel", actions.cancel, methods=["POST"]),
        Route(q + "/jobs/{job}/settings", actions.settings, methods=["POST"]),
        Route(q + "/jobs/{job}/retry", actions.retry, methods=["POST"]),
        Route(q + "/jobs/{job}/delete", actions.delete, methods=["POST"]),
        Route(q + "/dead/replay", actions.replay, methods=["POST"]),
        Route(q + "/dead/purge", actions.purge, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]


async def _not_found(request: Request, exc: Exception) -> Response:
    return error_page(request, 404, "Not found", f"There is no page at {request.url.path}.")


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return error_page(request, 405, "Not allowed", "That page does not take this method.")


def create_app(settings: WebSettings) -> Starlette:
    """The dashboard for ``settings``."""
    backend = Backend(settings)
    guard = Guard(settings.token, settings.basic)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        backend.close()

    app = Starlette(routes=_routes(), lifespan=lifespan,
                    exception_handlers={404: _not_found, 405: _not_allowed})
    app.state.backend = backend
    app.state.guard = guard
    app.add_middleware(Gate, guard=guard, read_only=settings.read_only)
    return app
