"""The dashboard's two Redis clients and the queue reads every page shares.

Reads use the inspector role's credentials (``--redis-url``), actions the admin
role's (``--admin-url``). Both clients fail fast (short timeouts, one retry) so a lost
Redis gives an error page at once, and are made again on the next request when the
server could not be reached at start: the app recovers by itself when Redis returns.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from streamq.base.keys import QUEUES, QueueKeys, check_name
from streamq.ops import queue_overview
from streamq.producer.client import Queue
from streamq.services.shards import read_shards, registered_queues
from streamq.storage.connection import Client, connect, undecided

from ..errors import ConnectionFailed
from .snapshots import Snapshots
from .trends import TrendCache

#: Socket timeouts of the dashboard's clients, seconds.
SOCKET_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 2.0
#: Queue names listed at most.
MAX_QUEUES = 1000
#: Names of the registry of queues that are not valid queue names shown at most (as
#: invalid rows; the others are counted).
MAX_INVALID_SHOWN = 20
#: The registry of queues is read with SSCAN, this many a call, at most _SCAN_CALLS
#: calls: whatever it holds (any credential that may use a queue adds to it), a page
#: reads a bounded part of it.
_SCAN_COUNT = 250
_SCAN_CALLS = 20


@dataclass(frozen=True)
class QueueNames:
    """The queues a page lists: the registry's valid names (and those of the command
    line), sorted, and what else the registry held."""

    valid: list[str]
    #: names of the registry that are no valid queue name (shown escaped, as invalid)
    invalid: list[str]
    invalid_total: int  #: invalid names read (more than ``invalid`` when capped)
    registered: int  #: names in the registry (SCARD)
    read: int  #: names read (fewer than ``registered`` when the read was capped)

    @property
    def capped(self) -> bool:
        return self.read < self.registered


class RedisUnavailable(Exception):
    """Raised when Redis cannot be reached (or cannot serve) for a page or an action."""


@dataclass
class WebSettings:
    """How ``streamq web`` runs."""

    redis_url: str
    admin_url: str | None = None  #: None: actions use ``redis_url``
    #: the admin's password (``--admin-password-file``); else the one in ``admin_url``.
    #: Either wins over ``STREAMQ_REDIS_PASSWORD_FILE`` (the reads' password)
    admin_password: str | None = None
    token: str | None = None
    basic: tuple[str, str] | None = None
    read_only: bool = False
    queues: Sequence[str] = field(default_factory=tuple)  #: shown besides the registry
    cluster: bool | None = None


class _Lazy:
    """A client made on first use, made again while the server could not be reached."""

    def __init__(self, url: str, cluster: bool | None, password: str | None = None) -> None:
        self.url, self.cluster, self.password = url, cluster, password
        self._client: Client | None = None
        self._lock = threading.Lock()

    def get(self) -> Client:
        with self._lock:
            c = self._client
            if c is not None and not undecided(c):
                return c
            if c is not None:
                c.close()
                self._client = None
            extra: dict[str, Any] = {} if self.password is None else {"password": self.password}
            try:
                c = connect(self.url, cluster=self.cluster, retry=Retry(NoBackoff(), 1),
                            socket_timeout=SOCKET_TIMEOUT_S,
                            socket_connect_timeout=CONNECT_TIMEOUT_S, **extra)
            except ConnectionFailed as e:
                raise RedisUnavailable(str(e)) from None
            self._client = c
            if undecided(c):  # not reachable now: asked again next time
                reason = getattr(c, "streamq_undecided", None)
                raise RedisUnavailable(reason if isinstance(reason, str)
                                       else "cannot reach Redis")
            return c

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class Backend:
    """The clients, the overview cache and the list of queues."""

    def __init__(self, settings: WebSettings) -> None:
        self.settings = settings
        self._reads = _Lazy(settings.redis_url, settings.cluster)
        admin_password = settings.admin_password
        if admin_password is None and settings.admin_url:
            # a password in the admin URL is the admin's, whatever the reads' password
            # file says (which connect() would otherwise put first)
            admin_password = urlsplit(settings.admin_url).password
            admin_password = unquote(admin_password) if admin_password else None
        self._admin = (_Lazy(settings.admin_url or settings.redis_url, settings.cluster,
                             admin_password)
                       if settings.admin_url or admin_password else self._reads)
        self.snapshots = Snapshots(self._overview)
        self.trends = TrendCache(lambda: self.r)
        for q in settings.queues:
            check_name("queue name", q)

    @property
    def r(self) -> Client:
        return self._reads.get()

    def clients(self) -> list[tuple[str, Any]]:
        """(which URL, how to get its client) of the reads and, when it has its own
        credentials, of the actions: what a start checks."""
        out: list[tuple[str, Any]] = [("--redis-url", self._reads.get)]
        if self._admin is not self._reads and not self.settings.read_only:
            out.append(("--admin-url", self._admin.get))
        return out

    def admin_queue(self, name: str) -> Queue:
        """A Queue on the admin client, for actions."""
        return Queue(name, client=self._admin.get())

    def queue(self, name: str) -> Queue:
        """A Queue on the read client (reads only: nothing of it writes)."""
        return Queue(check_name("queue name", name), client=self.r)

    def queue_names(self) -> QueueNames:
        """The registry of queues (a bounded part of it: SSCAN, at most about
        MAX_QUEUES names) and the queues named on the command line. A name that is no
        valid queue name is kept apart, never used as one."""
        registered = int(self.r.scard(QUEUES))
        listed, invalid, seen = registered_queues(self.r, MAX_QUEUES, count=_SCAN_COUNT,
                                                  calls=_SCAN_CALLS)
        return QueueNames(sorted({*listed, *self.settings.queues}),
                          sorted(invalid)[:MAX_INVALID_SHOWN], len(invalid),
                          max(registered, seen), seen)

    def shards(self, name: str) -> list[QueueKeys]:
        """The queue's stored shards (its first only, when none are stored yet);
        CorruptShards (a ConfigError) when its stored shard list is corrupt."""
        return read_shards(self.r, check_name("queue name", name)) or [QueueKeys(name)]

    def _overview(self, name: str) -> queue_overview.Overview:
        # the dashboard shows no job row of the overview: the small jobs' are not read
        return queue_overview.overview(self.r, self.shards(name), small_rows=False)

    def require_queue(self, name: str) -> list[QueueKeys]:
        """The queue's shards; QueueNotFound for a queue with no key, CorruptShards for
        a queue whose stored shard list is corrupt."""
        shards = self.shards(name)
        queue_overview.require_queue(self.r, shards)
        return shards

    def close(self) -> None:
        self._reads.close()
        self._admin.close()


def transient(e: BaseException) -> bool:
    """An error that means Redis is unreachable or cannot serve now."""
    if isinstance(e, (RedisUnavailable, ConnectionFailed, redis.ConnectionError,
                      redis.TimeoutError, ConnectionError, TimeoutError)):
        return True
    if isinstance(e, redis.exceptions.RedisClusterException):
        return True
    text = str(e)
    return isinstance(e, redis.ResponseError) and text.startswith(
        ("LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY"))
