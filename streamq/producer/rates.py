"""Rate limits: at most N sub-requests started per second, per client and per queue.

A limit is a token bucket kept in Redis, shared by every worker: ``rate``
permits per second (Redis's clock) up to ``burst`` saved. Limits are stored
with the queue (``sq:{<queue>}:rates``, its first shard's slot) and so are the
buckets (``sq:{<queue>}:buckets``): one bucket per limit however many shards
the queue has, so a limit is exact across shards; ``take_permits`` reads the
limits and updates the buckets atomically.

A worker slot takes permits after it claimed a job's token and before it
reads the job's entries: it reads as many entries as it was granted (and
gives back those it did not find). A token whose client has no permit now is
parked, and the shard's ``retries`` notes ``rate|<job>|<n>`` at the time the
next permit is due: the slot that takes that note (in ``settle``) unparks the
job's tokens, so nothing spins and other clients' tokens are claimed
meanwhile. Small jobs (:mod:`streamq.lane_work`): a limited client's lane
streams are read apart, ``COUNT`` = the permits granted, and skipped while
its bucket is empty.

Workers learn which limits exist from the stored limits, read again every
:data:`REFRESH_S`; with none, a worker takes no permits at all (no round trip).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from streamq.base.keys import QueueKeys, check_name
from streamq.base.members import token_job
from streamq.base.replies import Call
from streamq.errors import ConfigError
from streamq.storage.connection import is_transient, pipelined

if TYPE_CHECKING:
    from streamq.model.queue_view import QueueStore as Queue
    from streamq.model.queue_view import Served

__all__ = ["RATE_DUE", "Limiter", "RateLimit", "RateLimits", "check_rate", "read_rates",
           "set_rate"]

#: the prefix of a rate-limited job's note in a shard's ``retries`` (never a job id: ``|``)
RATE_DUE = "rate|"
#: how often a worker reads the stored limits again, s (a changed limit applies to
#: starts within this long)
REFRESH_S = 0.5
#: the highest rate and burst accepted (per second; permits)
MAX_RATE = 1_000_000.0
MAX_BURST = 1_000_000
#: jobs whose client a worker remembers (the client of a job never changes)
_CLIENT_CACHE = 10_000
_QUEUE = "queue"


@dataclass(frozen=True)
class RateLimit:
    """One limit: ``per_second`` starts per second, ``burst`` saved up at most;
    ``client`` None for the whole queue."""

    per_second: float
    burst: int
    client: str | None = None

    def spec(self) -> str:
        return f"{self.per_second!r}|{self.burst}"


@dataclass(frozen=True)
class RateLimits:
    """A queue's limits: the queue's own (or None) and each client's."""

    queue: RateLimit | None = None
    clients: dict[str, RateLimit] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"queue": asdict(self.queue) if self.queue else None,
                "clients": {c: asdict(r) for c, r in sorted(self.clients.items())}}

    def __bool__(self) -> bool:
        return self.queue is not None or bool(self.clients)

    def describe(self) -> list[str]:
        """One line per limit, as ``status``, ``watch`` and ``rate`` show them."""
        lines = []
        if self.queue is not None:
            lines.append(f"queue {self.queue.per_second:g}/s (burst {self.queue.burst})")
        for name, lim in sorted(self.clients.items()):
            lines.append(f"client {name} {lim.per_second:g}/s (burst {lim.burst})")
        return lines


def check_rate(per_second: float, burst: int | None) -> tuple[float, int]:
    """A valid (rate, burst): the rate a finite number above 0 (at most MAX_RATE),
    the burst an int of 1..MAX_BURST, by default the rate rounded up (one second's
    starts). Else ConfigError."""
    if isinstance(per_second, bool) or not isinstance(per_second, (int, float)):
        raise ConfigError(f"rate must be a number of sub-requests per second, got {per_second!r}")
    rate = float(per_second)
    if not math.isfinite(rate) or rate <= 0 or rate > MAX_RATE:
        raise ConfigError(f"rate must be above 0 and at most {MAX_RATE:g} per second, "
                          f"got {per_second!r}")
    if burst is None:
        burst = max(1, min(MAX_BURST, math.ceil(rate)))
    if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= MAX_BURST:
        raise ConfigError(f"burst must be an integer of 1..{MAX_BURST}, got {burst!r}")
    return rate, burst


def _field(client: str | None) -> str:
    return _QUEUE if client is None else f"client:{check_name('client name', client)}"


def set_rate(q: Queue, per_second: float | None, client: str | None = None,
             burst: int | None = None) -> bool:
    """Set (or with ``per_second`` None clear) a limit of queue ``q``; True when the
    stored limit changed."""
    name = _field(client)
    if per_second is None:
        if burst is not None:
            raise ConfigError("a burst needs a rate")
        spec = ""
    else:
        rate, b = check_rate(per_second, burst)
        spec = RateLimit(rate, b).spec()
    changed = int(q.scripts.run("set_rate", (q.keys.rates, q.keys.buckets), (name, spec))) == 1
    if changed:
        wake_held(q)
    return changed


def wake_held(q: Queue) -> int:
    """Make every job a limit holds back due now: its ``rate|`` notes in each shard's
    ``retries`` are moved to Redis's now (``schedule_retry``: ZADD LT), so the next
    settle unparks its tokens and they ask for permits under the limits as they are
    (none, once cleared). A small job's lane is read again within ``REFRESH_S`` by
    itself. A note taken by a worker between the scan and the move comes back due
    once more: one more unpark of that job, which parks or drops its tokens again when
    it has nothing to deliver (harmless, as any unpark is). Returns the notes moved."""
    moved = 0
    for qk in q.shards:
        notes = [m.decode() if isinstance(m, bytes) else str(m)
                 for m, _ in q.redis.zscan_iter(qk.retries, match=f"{RATE_DUE}*", count=1000)]
        for start in range(0, len(notes), 1000):
            q.scripts.run_many([q.scripts.schedule_retry_call(qk, n, 0)
                                for n in notes[start : start + 1000]])
        moved += len(notes)
    return moved


def parse_rates(raw: dict[Any, Any]) -> RateLimits:
    """The limits of a ``rates`` hash (HGETALL reply); malformed fields are skipped."""
    queue: RateLimit | None = None
    clients: dict[str, RateLimit] = {}
    for k, v in raw.items():
        key = k.decode() if isinstance(k, bytes) else str(k)
        val = v.decode() if isinstance(v, bytes) else str(v)
        rate, _, burst = val.partition("|")
        try:
            limit = (float(rate), int(burst))
        except ValueError:
            continue
        if key == _QUEUE:
            queue = RateLimit(*limit)
        elif key.startswith("client:"):
            c = key[len("client:"):]
            clients[c] = RateLimit(*limit, client=c)
    return RateLimits(queue, clients)


def read_rates(r: Any, qk: QueueKeys) -> RateLimits:
    """The stored limits of the queue of ``qk``."""
    return parse_rates(r.hgetall(qk.rates))


def take_permits_call(qk: QueueKeys, asks: Sequence[tuple[str, int]]) -> Call:
    """Take (n > 0) or give back (n < 0) permits for each (client, n); see
    take_permits-2.lua."""
    args: list[Any] = []
    for client, n in asks:
        args += [client, n]
    return Call("take_permits", (qk.rates, qk.buckets), args)


class Limiter:
    """A worker's view of its queue's limits, shared by its slots: which limits
    exist (read again every REFRESH_S), the clients of the jobs it served, which
    clients' small jobs wait for a permit; and the permit calls."""

    def __init__(self, worker: Served) -> None:
        self.w = worker
        self.qk = QueueKeys(worker.keys.name)
        self._lock = threading.Lock()
        self._limits = RateLimits()
        self._read_at = -math.inf
        self._clients: dict[str, str] = {}
        #: client -> monotonic time until which its small jobs are not read
        self._throttled: dict[str, float] = {}

    # -- which limits exist -----------------------------------------------------------

    def limits(self) -> RateLimits:
        """The stored limits, as read at most REFRESH_S ago."""
        now = time.monotonic()
        if now - self._read_at >= REFRESH_S:
            with self._lock:
                if now - self._read_at >= REFRESH_S:
                    try:
                        limits = read_rates(self.w.redis, self.qk)
                    except Exception as e:
                        # Redis busy or away for a moment: the limits read last hold (the
                        # next call reads again); with none read yet the caller waits it out
                        if not is_transient(e) or self._read_at == -math.inf:
                            raise
                        return self._limits
                    if limits != self._limits:
                        # a changed limit: small jobs held back under the old one are
                        # read again now, as set_rate wakes the job lane's (wake_held)
                        self._throttled.clear()
                    self._limits, self._read_at = limits, now
        return self._limits

    def active(self) -> bool:
        """Some limit is set on the queue."""
        return bool(self.limits())

    def limited(self, client: str) -> bool:
        """Starts of ``client``'s sub-requests need permits."""
        lim = self.limits()
        return lim.queue is not None or client in lim.clients

    # -- small jobs: clients skipped while their bucket is empty --------------------------

    def throttle(self, client: str, wait_ms: int) -> None:
        self._throttled[client] = time.monotonic() + wait_ms / 1000

    def throttled(self, client: str) -> bool:
        until = self._throttled.get(client)
        return until is not None and until > time.monotonic()

    def next_wake_s(self) -> float | None:
        """Seconds until the next throttled client may be read again (None: none)."""
        now = time.monotonic()
        waits = [t - now for t in list(self._throttled.values()) if t > now]
        return min(waits) if waits else None

    # -- permits ----------------------------------------------------------------------

    def take(self, asks: Sequence[tuple[str, int]]) -> list[tuple[int, int]]:
        """(granted, ms until the next permit) for each (client, wanted) of ``asks``, in
        one call."""
        if not asks:
            return []
        call = take_permits_call(self.qk, asks)
        raw = self.w.scripts.run(call.name, call.keys, call.args)
        return [(int(raw[i]), int(raw[i + 1])) for i in range(0, len(raw), 2)]

    def give_back(self, unused: Sequence[tuple[str, int]]) -> None:
        """Return permits taken and not used (no entry to start)."""
        back = [(c, -n) for c, n in unused if n > 0]
        if back:
            self.take(back)

    def clients_of(self, jobs: Sequence[str]) -> list[str]:
        """The client of each job (its meta, remembered; "" for a job gone)."""
        missing = list(dict.fromkeys(j for j in jobs if j not in self._clients))
        if missing:
            found = pipelined(self.w.redis, [("HGET", self.qk.job(j).meta, "client")
                                             for j in missing])
            if len(self._clients) + len(missing) > _CLIENT_CACHE:
                self._clients.clear()
            for j, c in zip(missing, found):
                if isinstance(c, Exception):
                    raise c
                if c is not None:
                    self._clients[j] = c.decode() if isinstance(c, bytes) else str(c)
        return [self._clients.get(j, "") for j in jobs]

    def grant(self, qk: QueueKeys, tokens: Sequence[str], want: int) -> dict[int, int]:
        """Permits taken for each claimed token's read of up to ``want`` entries, by the
        token's position (0: refused); tokens of unlimited clients are left out (their
        reads need none, and take no call). The jobs of refused tokens are noted in shard
        ``qk``'s ``retries`` (``rate|<job>|<n>``, due when the next permit is) before the
        caller parks their tokens, so they are unparked then."""
        jobs = [token_job(t) for t in tokens]
        clients = self.clients_of(jobs)
        out: dict[int, int] = {}
        ask = [i for i, c in enumerate(clients) if self.limited(c)]
        if not ask:
            return out
        refused: dict[str, tuple[int, int]] = {}  # job -> (tokens to unpark, wait ms)
        for i, (got, wait) in zip(ask, self.take([(clients[i], want) for i in ask])):
            out[i] = got
            if got == 0:
                n = int(tokens[i].rsplit("#", 1)[1]) + 1
                have = refused.get(jobs[i], (0, wait))
                refused[jobs[i]] = (max(have[0], n), min(have[1], wait))
        if refused:
            sc = self.w.scripts
            sc.run_many([sc.schedule_retry_call(qk, f"{RATE_DUE}{job}|{n}", wait)
                         for job, (n, wait) in refused.items()])
        return out


def parse_due(member: str) -> tuple[str, int]:
    """(job, tokens to unpark) of a ``rate|<job>|<n>`` note."""
    job, _, n = member[len(RATE_DUE):].rpartition("|")
    return job, int(n)
