"""``streamq web``: serve the dashboard (:mod:`streamq.web`) with uvicorn."""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
from typing import Annotated, Any

import redis
import typer

from streamq.storage.connection import ping
from streamq.storage.redis_errors import is_access_error

from ..errors import ConfigError, StreamqError
from .common import DEFAULT_URL, ExitCode, RedisUrl, app, error_line, fail

#: Port the dashboard listens on unless told otherwise.
DEFAULT_PORT = 8080


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _stopped(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _check_redis(clients: list[tuple[str, Any]]) -> None:
    """Refuse to start on credentials Redis refuses (exit 3); a Redis that does not
    answer yet is said in one line, and the pages say so until it does. ``clients``:
    (which URL, how to get its client) as the dashboard makes them."""
    from ..web.backend import RedisUnavailable  # (the web extra is there by now)

    for which, get in clients:
        try:
            ping(get())
        except (redis.RedisError, StreamqError, RedisUnavailable) as e:
            if "refused access" in str(e) or is_access_error(e):
                raise fail(f"Redis refused the credentials of {which}: {e}",
                           ExitCode.REDIS_UNAVAILABLE) from None
            error_line(f"warning: Redis at {which} does not answer yet ({e}); the "
                       "dashboard starts and shows it unavailable until it does")


@app.command(rich_help_panel="Inspect")
def web(
    host: Annotated[str, typer.Option(envvar="STREAMQ_WEB_HOST",
                                      help="address to listen on (loopback unless told)")] =
        "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, envvar="STREAMQ_WEB_PORT",
                                      help="port to listen on")] = DEFAULT_PORT,
    redis_url: RedisUrl = DEFAULT_URL,
    admin_url: Annotated[str | None, typer.Option(
        envvar="STREAMQ_WEB_ADMIN_URL",
        help="Redis URL for actions, with the admin role's credentials (default: "
             "--redis-url, whose credentials should be the inspector role's)")] = None,
    admin_password_file: Annotated[str | None, typer.Option(
        envvar="STREAMQ_WEB_ADMIN_PASSWORD_FILE",
        help="file whose first line is the admin's Redis password (wins over the "
             "password in --admin-url and over STREAMQ_REDIS_PASSWORD_FILE)")] = None,
    token_file: Annotated[str | None, typer.Option(
        envvar="STREAMQ_WEB_TOKEN_FILE", help="file whose first line is the access token")] =
        None,
    basic_auth_file: Annotated[str | None, typer.Option(
        envvar="STREAMQ_WEB_BASIC_AUTH_FILE",
        help="file whose first line is 'user:password' for basic authentication")] = None,
    no_auth: Annotated[bool, typer.Option(
        "--no-auth", help="ask for no credentials (only on a loopback address)")] = False,
    read_only: Annotated[bool, typer.Option("--read-only", envvar="STREAMQ_WEB_READ_ONLY",
                                            help="refuse every action")] = False,
    queue: Annotated[list[str] | None, typer.Option(
        "--queue", "-q", help="also list this queue (repeat); queues register themselves "
                              "on first use")] = None,
    log_level: Annotated[str, typer.Option(envvar="STREAMQ_LOG_LEVEL",
                                           help="DEBUG, INFO, WARNING, ERROR")] = "INFO",
) -> None:
    """Serve the web dashboard: queues, jobs, workers, dead letters, live; and actions
    (pause, resume, cancel, priority, replay, purge) unless --read-only."""
    try:
        import uvicorn

        from ..web.app import WebSettings, create_app
        from ..web.security import read_basic, read_secret
    except ImportError as e:
        raise fail(f"the dashboard needs the web extra: pip install 'streamq[web]' ({e})",
                   ExitCode.USAGE) from None
    given = [x for x in (token_file, basic_auth_file) if x]
    if len(given) > 1:
        raise fail("give --token-file or --basic-auth-file, not both", ExitCode.USAGE)
    if not given and not no_auth:
        raise fail("give --token-file or --basic-auth-file (or --no-auth, on a loopback "
                   "address only)", ExitCode.USAGE)
    if no_auth and given:
        raise fail("--no-auth with credentials: choose one", ExitCode.USAGE)
    if no_auth and not _loopback(host):
        raise fail(f"--no-auth on {host}: a dashboard without credentials listens on a "
                   "loopback address only", ExitCode.USAGE)
    try:
        token = read_secret(token_file, "token") if token_file else None
        basic = read_basic(basic_auth_file) if basic_auth_file else None
        admin_password = (read_secret(admin_password_file, "admin password")
                          if admin_password_file else None)
        settings = WebSettings(redis_url=redis_url, admin_url=admin_url,
                               admin_password=admin_password, token=token,
                               basic=basic, read_only=read_only, queues=tuple(queue or ()))
        application = create_app(settings)
    except ConfigError as e:
        raise fail(str(e), ExitCode.USAGE) from None
    level = log_level.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise fail(f"invalid log level {log_level!r}", ExitCode.USAGE)
    _check_redis(application.state.backend.clients())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    typer.echo(f"streamq web on http://{host}:{port}/ (pid {os.getpid()}"
               f"{', read-only' if read_only else ''})", err=True)
    # uvicorn stops gracefully on SIGTERM/SIGINT, then raises the signal again under the
    # handler that was there before it: a stop signal ends the process with exit 0 (as the
    # worker and the reaper), not killed by its signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stopped)
    try:
        uvicorn.run(application, host=host, port=port, log_level=level.lower(),
                    access_log=level == "DEBUG", timeout_graceful_shutdown=3,
                    proxy_headers=False)
    except OSError as e:
        raise fail(f"cannot listen on {host}:{port}: {e}", ExitCode.USAGE) from None
