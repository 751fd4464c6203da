"""What every page shares: rendering, errors, flash messages, query parsing."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from streamq.ops.queue_overview import DeadLetterNotFound, QueueNotFound
from streamq.services.shards import CorruptShards

from ..errors import ConfigError, JobNotFound, StreamqError
from .backend import Backend, transient
from .security import CSRF_COOKIE, Guard, new_browser_id

log = logging.getLogger("streamq.web")

HERE = Path(__file__).parent
ENV = Environment(loader=FileSystemLoader(HERE / "templates"),
                  autoescape=select_autoescape(default=True, default_for_string=True),
                  trim_blocks=True, lstrip_blocks=True)


def _ms(v: Any) -> str:
    if v is None:
        return "-"
    v = float(v)
    if abs(v) < 1000:
        return f"{v:.0f} ms"
    if abs(v) < 120_000:
        return f"{v / 1000:.1f} s"
    if abs(v) < 7_200_000:
        return f"{v / 60_000:.1f} min"
    return f"{v / 3_600_000:.1f} h"


def _when(ms_epoch: Any) -> str:
    if not ms_epoch:
        return "-"
    import datetime as dt
    return dt.datetime.fromtimestamp(int(ms_epoch) / 1000, dt.UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC")


def _num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if v < 100 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


ENV.filters["ms"] = _ms
ENV.filters["when"] = _when
ENV.filters["num"] = _num


class NotFound(StreamqError):
    """Raised when a page names something that does not exist."""


def backend_of(request: Request) -> Backend:
    """The app's backend (clients, caches, settings)."""
    backend: Backend = request.app.state.backend
    return backend


def browser_id(request: Request) -> tuple[str, bool]:
    """The browser's CSRF cookie value, and whether it is new (to be set)."""
    have = request.cookies.get(CSRF_COOKIE, "")
    if have and len(have) <= 64:
        return have, False
    return new_browser_id(), True


def render(request: Request, template: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    """A page: the template with what every page needs."""
    guard: Guard = request.app.state.guard
    backend = backend_of(request)
    bid, new = browser_id(request)
    flash = None
    msg = request.query_params.get("flash")
    sig = request.query_params.get("sig", "")
    if msg is not None and guard.csrf_ok("flash|" + msg, sig):
        flash = (msg, request.query_params.get("outcome", "ok"))
        if flash[1] not in ("ok", "error"):
            flash = (msg, "ok")
    html = ENV.get_template(template).render(
        request=request, csrf=guard.csrf_token(bid), read_only=backend.settings.read_only,
        flash=flash, path=request.url.path, **ctx)
    resp = HTMLResponse(html, status_code=status)
    if new:
        resp.set_cookie(CSRF_COOKIE, bid, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return resp


def fragment(template: str, **ctx: Any) -> str:
    """A piece of a page (for a live update), rendered like a page."""
    return ENV.get_template(template).render(**ctx)


def back_to(request: Request, url: str, message: str, ok: bool = True) -> RedirectResponse:
    """303 to ``url`` with a signed flash message (only the app can make one)."""
    guard: Guard = request.app.state.guard
    sep = "&" if "?" in url else "?"
    query = urlencode({"flash": message, "outcome": "ok" if ok else "error",
                       "sig": guard.csrf_token("flash|" + message)})
    return RedirectResponse(f"{url}{sep}{query}", status_code=303)


def error_page(request: Request, status: int, title: str, message: str) -> HTMLResponse:
    return render(request, "error.html", status=status, status_code=status, title=title,
                  message=message)


def handle(request: Request, e: Exception) -> Response:
    """The page for an error a view let through."""
    if transient(e):
        log.warning("Redis unavailable for %s: %s", request.url.path, e)
        return error_page(request, 503, "Redis is unavailable",
                          "The dashboard cannot reach Redis (or Redis cannot serve now). "
                          "This page works again as soon as Redis does: reload it.")
    if isinstance(e, (QueueNotFound, JobNotFound, DeadLetterNotFound, NotFound)):
        return error_page(request, 404, "Not found", str(e))
    if isinstance(e, CorruptShards):  # the queue's stored configuration, not the request
        return error_page(request, 409, "Corrupt queue configuration", str(e))
    if isinstance(e, ConfigError):
        return error_page(request, 400, "Bad request", str(e))
    if isinstance(e, StreamqError):
        return error_page(request, 409, "Refused", str(e))
    log.exception("error serving %s", request.url.path)
    return error_page(request, 500, "Internal error",
                      "The dashboard failed to serve this page; the error is in its log.")


def guarded(view: Callable[[Request], Response]) -> Callable[[Request], Response]:
    """A page whose errors become error pages (:func:`handle`)."""
    @functools.wraps(view)
    def page(request: Request) -> Response:
        try:
            return view(request)
        except Exception as e:
            return handle(request, e)
    return page


def int_param(request: Request, name: str, lo: int, hi: int) -> int | None:
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return None
    try:
        v = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if not lo <= v <= hi:
        raise ConfigError(f"{name} must be between {lo} and {hi}, got {v}")
    return v


def float_param(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return None
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if v < 0 or v != v:
        raise ConfigError(f"{name} must be >= 0, got {raw!r}")
    return v
