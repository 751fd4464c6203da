"""What every command shares: the app, exit codes, option aliases, error mapping."""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import redis
import typer
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.retry import Retry
from rich.console import Console
from rich.table import Column
from typer.core import TyperArgument, TyperGroup

from streamq.base import config
from streamq.ops.queue_overview import DeadLetterNotFound, QueueNotFound, require_queue
from streamq.storage.connection import Client, connect, ping

from ..errors import (
    ConfigError,
    ConnectionFailed,
    HandlerError,
    JobNotFound,
    PayloadError,
    StreamqError,
)
from .finite import finite


class ExitCode(enum.IntEnum):
    """Exit codes of every streamq command."""

    OK = 0
    FAILURE = 1  #: the command ran, and what it reports failed (a job failed, a timeout)
    USAGE = 2  #: bad argument, option, URL, handler or input file
    REDIS_UNAVAILABLE = 3  #: Redis unreachable, or it refused the credentials
    NOT_FOUND = 4  #: unknown queue, job or dead letter
    UNHEALTHY = 5  #: ``streamq health``: Redis answers but the check failed
    REPLAYED = 6  #: ``streamq dlq replay``: a dead letter was replayed already (once each)


#: Redis URL used when neither --redis-url nor STREAMQ_REDIS_URL is given.
DEFAULT_URL = "redis://127.0.0.1:6379/0"


def error_line(message: str) -> None:
    """Print one ``streamq: ...`` line on stderr."""
    typer.echo(f"streamq: {message}", err=True)


def fail(message: str, code: ExitCode) -> typer.Exit:
    """Print one error line; return the Exit to raise."""
    error_line(message)
    return typer.Exit(int(code))


def is_bad_db(e: BaseException) -> bool:
    """Redis refused the URL's database number (SELECT out of range)."""
    return isinstance(e, redis.ResponseError) and "DB index is out of range" in str(e)


def classify(e: BaseException) -> tuple[ExitCode, str] | None:
    """The exit code and one-line message for an error a command let through."""
    if is_bad_db(e):
        return ExitCode.USAGE, f"invalid Redis URL: the server has no such database ({e})"
    if isinstance(e, ConnectionFailed):
        return ExitCode.REDIS_UNAVAILABLE, str(e)
    if isinstance(e, redis.AuthenticationError):
        return ExitCode.REDIS_UNAVAILABLE, f"Redis refused the credentials: {e}"
    if isinstance(e, (redis.ConnectionError, redis.TimeoutError, ConnectionError)):
        return ExitCode.REDIS_UNAVAILABLE, f"cannot reach Redis: {e}"
    if isinstance(e, (redis.exceptions.ClusterDownError, redis.exceptions.ClusterError,
                      redis.exceptions.RedisClusterException)) or (
            isinstance(e, redis.ResponseError) and str(e).startswith("CLUSTERDOWN")):
        return ExitCode.REDIS_UNAVAILABLE, f"the Redis Cluster cannot serve: {e}"
    if isinstance(e, (ConfigError, HandlerError, PayloadError)):
        return ExitCode.USAGE, str(e)
    if isinstance(e, (JobNotFound, QueueNotFound, DeadLetterNotFound)):
        return ExitCode.NOT_FOUND, str(e)
    if isinstance(e, StreamqError):  # JobConflict, WaitTimeout, ...
        return ExitCode.FAILURE, str(e)
    if isinstance(e, redis.RedisError):
        return ExitCode.FAILURE, f"Redis error: {e}"
    return None


#: an option's placeholder by the last word of its name (else by its type)
_WORD_PLACEHOLDERS = {"url": "URL", "id": "ID", "key": "KEY", "file": "PATH", "dir": "PATH",
                      "path": "PATH", "handler": "MODULE:FUNCTION", "at": "TIME",
                      "queue": "QUEUE", "client": "NAME", "name": "NAME", "host": "HOST",
                      "level": "LEVEL", "format": "FORMAT", "addr": "ADDRESS", "ms": "MS"}
#: float options counted in seconds, by the last word of their name
_SECONDS = {"timeout", "delay", "interval", "heartbeat", "idle", "every", "grace", "wait",
            "block", "lease", "window", "period", "s"}


def _placeholder(p: Any) -> str | None:
    """A placeholder in capitals, as Unix tools print them (QUEUE, N, SECONDS, URL).
    Types are told by their class names (typer carries its own copy of click's)."""
    kind = type(p.type).__name__
    if kind == "Choice" or getattr(p, "is_flag", False):
        return None  # the choices, or nothing
    name = (p.name or "").lower()
    if isinstance(p, TyperArgument):
        return name.upper()
    word = name.rsplit("_", 1)[-1]
    if word in _WORD_PLACEHOLDERS:
        return _WORD_PLACEHOLDERS[word]
    if kind in ("IntParamType", "IntRange"):
        return "N"
    if kind in ("FloatParamType", "FloatRange"):
        seconds = word in _SECONDS or "second" in (getattr(p, "help", None) or "")
        return "SECONDS" if seconds else "NUMBER"
    if kind == "Path":
        return "PATH"
    return "TEXT"


class _Argument(TyperArgument):
    """An argument shown as click shows one: QUEUE, [PAYLOADS]..."""

    def make_metavar(self, ctx: Any, *, usage: bool = False) -> str:
        var = self.metavar or (self.name or "").upper()
        if usage and not self.required:
            var = f"[{var}]"
        return var + ("..." if self.nargs != 1 else "")


def name_placeholders(cmd: Any) -> None:
    """Give every parameter of ``cmd`` and its subcommands a placeholder in capitals
    (typer's own read ``<str>``, ``<int range>``, ``{queue}``); float ones refuse NaN
    and infinity."""
    for p in cmd.params:
        if p.metavar is None:
            p.metavar = _placeholder(p)
        finite(p)
        if isinstance(p, TyperArgument):
            p.__class__ = _Argument
    for sub in getattr(cmd, "commands", {}).values():
        name_placeholders(sub)


#: options of the root that no command has: taken wherever they stand in the line
ROOT_FLAGS = frozenset({"--cluster", "--no-cluster"})
ROOT_VALUED = frozenset({"--wait-replicas"})


def hoist_root_options(args: list[str]) -> list[str]:
    """``args`` with the root's own options moved before the command, so that
    ``streamq status q --cluster`` reads as ``streamq --cluster status q`` (they mean
    the same for every command). Nothing after ``--`` moves."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            rest += args[i:]
            break
        if a in ROOT_FLAGS or a.split("=", 1)[0] in ROOT_VALUED and "=" in a:
            front.append(a)
        elif a in ROOT_VALUED and i + 1 < len(args):
            front += args[i:i + 2]
            i += 1
        else:
            rest.append(a)
        i += 1
    return front + rest


class StreamqGroup(TyperGroup):
    """The root command: every error becomes one stderr line and an ExitCode."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        # errors are handled here (standalone_mode=False below), and the program is
        # always "streamq" in messages, also under `python -m streamq` and CliRunner
        name_placeholders(self)
        args = hoist_root_options(list(sys.argv[1:] if args is None else args))
        try:
            rv = super().main(args=args, prog_name="streamq", complete_var=complete_var,
                              standalone_mode=False, windows_expand_args=windows_expand_args,
                              **extra)
            code = rv if isinstance(rv, int) else 0
        except typer.Abort:
            error_line("aborted")
            code = ExitCode.FAILURE
        except typer.TyperException as e:  # click's usage errors
            code = e.exit_code
            if type(e).__name__ == "NoArgsIsHelpError":
                typer.echo(e.format_message(), err=True)
            else:
                ctx = getattr(e, "ctx", None)
                hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
                error_line(f"{e.format_message()}{hint}")
        except Exception as e:
            found = classify(e)
            if found is None:
                raise
            code, message = found
            error_line(message)
        sys.exit(int(code))


app = typer.Typer(cls=StreamqGroup, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  rich_markup_mode=None,
                  add_completion=True, help="A job queue on Redis Streams.")

# -- option aliases shared across commands ---------------------------------------------

RedisUrl = Annotated[str, typer.Option("--redis-url", envvar="STREAMQ_REDIS_URL",
                                       help="redis:// or rediss:// URL (user, password, TLS)")]
QueueArg = Annotated[str, typer.Argument(help="queue name", show_default=False)]
JobArg = Annotated[str, typer.Argument(help="job id", show_default=False)]
JsonOut = Annotated[bool, typer.Option("--json", help="print one JSON document to stdout")]
Timeout = Annotated[float | None, typer.Option(min=0.0, help="give up after this many seconds")]
LogLevel = Annotated[str, typer.Option(envvar="STREAMQ_LOG_LEVEL",
                                       help="DEBUG, INFO, WARNING, ERROR")]


class LogFormat(str, enum.Enum):
    text = "text"
    json = "json"


LogFormatOpt = Annotated[LogFormat, typer.Option(envvar="STREAMQ_LOG_FORMAT",
                                                 help="text, or one JSON object per line "
                                                      "(ts, level, logger, message)")]
ProcessQueue = Annotated[str, typer.Argument(envvar="STREAMQ_QUEUE", show_default=False,
                                             help="queue name")]
MetricsPort = Annotated[int | None, typer.Option(
    envvar="STREAMQ_METRICS_PORT", min=1, max=65535,
    help="serve Prometheus metrics on this port (off when not given)")]
#: How long a worker or reaper waits for Redis (at start and whenever it is lost)
#: before it gives up with exit code 3; unbounded when not given.
RedisWait = Annotated[float | None, typer.Option(
    "--redis-wait", min=0.0, envvar="STREAMQ_REDIS_WAIT",
    help="give up after Redis has been unreachable this many seconds (default: wait forever)")]
#: Where a worker writes its id (and ``streamq health --worker`` reads it): one JSON
#: document ``{worker_id, queue, heartbeat_s, pid}``; not written when not given.
WorkerIdFile = Annotated[str | None, typer.Option(
    "--id-file", envvar="STREAMQ_WORKER_ID_FILE",
    help="file where the worker writes its id for `streamq health --worker`")]
MetricsAddr = Annotated[str, typer.Option(envvar="STREAMQ_METRICS_ADDR",
                                          help="address the metrics endpoint listens on")]


# -- connecting and printing -----------------------------------------------------------


def make_client(url: str, *, quick: bool = False) -> Client:
    """A client with few retries, so a dead Redis fails fast (``quick``: none, 2 s timeouts).

    Raises ConnectionFailed for a Redis Cluster that cannot serve every slot."""
    if quick:
        c = connect(url, retry=Retry(NoBackoff(), 0), socket_connect_timeout=2.0,
                    socket_timeout=2.0)
    else:
        c = connect(url, retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 2))
    reason = getattr(c, "streamq_undecided", None)
    if isinstance(reason, str):  # a cluster node, but the cluster cannot serve
        c.close()
        raise ConnectionFailed(reason)
    return c


def client(url: str) -> Client:
    """A client that answered PING. A ``rediss://`` server is tried once first with
    short timeouts and no retries: a TLS handshake with a port that does not speak TLS
    hangs until the socket times out, and retried that would take a minute."""
    if url.startswith("rediss://"):
        try:
            probe = make_client(url, quick=True)
            try:
                ping(probe)
            finally:
                probe.close()
        except (redis.RedisError, ConnectionFailed) as e:
            if "timeout" not in str(e).lower():
                raise
            raise ConnectionFailed(f"cannot reach Redis over TLS: {e} (does that port speak "
                                   "TLS? rediss:// needs a TLS port, redis:// a plain one)"
                                   ) from None
    c = make_client(url)
    ping(c)
    return c


def emit_json(doc: Any) -> None:
    """Print one JSON document to stdout."""
    typer.echo(json.dumps(doc, indent=2, default=str))


def console() -> Console:
    """A rich console on the current stdout (so CliRunner captures it); wide when the
    output is not a terminal, so ids are never cut short in a pipe or a log."""
    wide = None if sys.stdout.isatty() else 200
    return Console(file=sys.stdout, highlight=False, soft_wrap=False, width=wide)


def ms(value: int | None) -> str:
    """A duration in ms, for people."""
    if value is None:
        return "-"
    s = value / 1000
    if abs(s) < 60:
        return f"{s:.1f}s"
    if abs(s) < 3600:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def fold(header: str) -> Column:
    """A table column for ids: folded onto more lines, never cut short."""
    return Column(header, overflow="fold")


YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")]
#: a job's settings, as `submit` and `repeat add` take them
PriorityOpt = Annotated[int, typer.Option(min=0, max=config.MAX_PRIORITY,
                                          help="0 is the most urgent")]
ConcurrencyOpt = Annotated[int, typer.Option(min=1, max=config.MAX_CONCURRENCY,
                                             help="sub-requests in flight at once")]
ClientOpt = Annotated[str, typer.Option("--client", help="client name, for fairness")]
MaxDeliveriesOpt = Annotated[int, typer.Option(min=1, help="attempts before a sub-request "
                                                           "is dead-lettered")]


def confirm_or_stop(yes: bool, question: str, unchanged: str) -> None:
    """Ask ``question`` on stderr unless ``yes``; a no ends the command (exit 1) with
    ``unchanged`` (what was left as it was)."""
    if not yes and not typer.confirm(question, err=True):
        raise fail(f"cancelled, {unchanged}", ExitCode.FAILURE)


CreateOpt = Annotated[bool, typer.Option(
    "--create", help="act on a queue that has no key yet (without it, a queue name "
                     "unknown to this Redis is refused: exit 4)")]


def existing_queue(name: str, url: str, create: bool = False) -> Any:
    """The queue client of ``name``; QueueNotFound (exit 4) when this Redis holds no key
    of it, unless ``create`` (a mistyped name must not succeed and leave a key)."""
    from streamq.base.keys import check_name
    from streamq.producer.client import Queue

    q = Queue(check_name("queue name", name), client=client(url))
    if not create:
        require_queue(q.redis, q.known_shards)
    return q


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, with an "s" unless ``n`` is 1: "1 shard", "3 shards"."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def when(ms_epoch: int | None) -> str:
    """A time in ms since the epoch as local ISO 8601 with its zone ("-" for None)."""
    if ms_epoch is None:
        return "-"
    from datetime import datetime

    return datetime.fromtimestamp(ms_epoch / 1000).astimezone().isoformat(
        sep=" ", timespec="seconds")


def print_table(table: Any, empty: str) -> None:
    """Print ``table``; with no row, one line instead (its title, then ``empty``)
    rather than a header over nothing."""
    out = console()
    if table.row_count:
        out.print(table)
    else:
        title = str(table.title) if table.title else ""
        out.print(f"{title}: {empty}" if title else empty)
