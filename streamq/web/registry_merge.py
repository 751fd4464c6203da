"""The Jobs view's merge of a queue's registries: their entries after a cursor,
highest (score, member) first, read a bounded window at a time (see
:mod:`streamq.web.listing`, which pages through it).

The cursor is the last entry examined (its score and member). Entries tied with it
(one score: jobs registered, or finished, in the same millisecond) are found by
position: a registry's ties are ordered by member, so the cursor's place among them
is read whole when they are few (:data:`TIE_READ`), else searched one entry per probe
(a binary search), never by reading every tie. A stream registry (``lkept``: one entry
names the jobs of one forget-after time) is read a whole millisecond at a time and
its jobs of one millisecond ordered by id, so it needs no tie search.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamq.base.keys import check_name
from streamq.storage.connection import Client

from ..errors import StreamqError

#: Jobs shown on one page.
PAGE_SIZE = 50
#: Candidates read per round of a filtered page (and at most per round of any page).
CHUNK = 250
#: Entries tied with the cursor's score read whole to find its place among them; a
#: registry with more is searched instead (one entry per probe).
TIE_READ = 250
#: Entries of a registry read at first for a page (more when there are few
#: registries: 2 * PAGE_SIZE over them, up to _CHUNK); a window taken whole is read
#: again twice as large.
_MIN_WINDOW = 8
#: Characters of a cursor accepted (a longer one starts at the first page).
_CURSOR_MAX = 1_024

INF = float("inf")

def as_bytes(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode()


#: (registry key, holds small jobs, scored by the job's creation time, a STREAM of
#: kept jobs: entry id the score's ms, field ``j`` the job ids; else a ZSET)
Registry = tuple[str, bool, bool, bool]
#: A registry entry: (score, member); the order of a page is this, highest first
Cursor = tuple[float, bytes]


@dataclass(frozen=True)
class Candidate:
    """One registry entry: its score and member, the job it names (None: the member
    names no valid job id), and whether the registry holds small jobs."""

    score: float
    member: bytes
    job: str | None
    small: bool


def _score(v: float) -> str:
    """A score as Redis reads it back exactly (``repr`` of a float round-trips)."""
    return "+inf" if v == INF else "-inf" if v == -INF else repr(float(v))


def _ms_bound(v: float, unbounded: str) -> str:
    """A score bound as a stream id bound (every entry of that millisecond)."""
    return unbounded if v in (INF, -INF) else str(int(v))


def format_cursor(cursor: Cursor) -> str:
    """``<score>:<member as hex>`` (a member may hold any byte)."""
    return f"{_score(cursor[0])}:{cursor[1].hex()}"


def parse_cursor(raw: str | None) -> Cursor | None:
    """A cursor made by :func:`format_cursor`, None for the first page (or a cursor
    that is not one: too long, malformed)."""
    if not raw or len(raw) > _CURSOR_MAX:
        return None
    score, sep, member = raw.partition(":")
    if not sep:
        return None
    try:
        value = float(score)
        return (value, bytes.fromhex(member)) if value == value else None
    except ValueError:
        return None


def job_of(member: bytes) -> str | None:
    """The job id a registry member names (a finished entry is ``<job>|<incarnation>``),
    None when it is not a job id."""
    try:
        job = member.partition(b"|")[0].decode("ascii")
        return check_name("job id", job)
    except (UnicodeDecodeError, StreamqError):
        return None


def _tie_offsets(r: Client, regs: list[Registry], tied: list[int], cursor: Cursor
                 ) -> dict[int, int]:
    """For each registry of ``tied`` (its range starts at the cursor's score): how many
    of its entries tied with that score come before the cursor or are it (members
    >= the cursor's: ties are ordered by member, highest first in a reverse read).
    Bounded: a registry's ties are read whole only when at most TIE_READ, else its
    place is searched with one-entry reads."""
    s = _score(cursor[0])
    pipe = r.pipeline(transaction=False)
    for i in tied:
        pipe.zcount(regs[i][0], s, s)
    counts = [int(n) for n in pipe.execute()]
    out: dict[int, int] = {}
    few = [(i, n) for i, n in zip(tied, counts) if 0 < n <= TIE_READ]
    if few:
        pipe = r.pipeline(transaction=False)
        for i, _ in few:
            pipe.zrevrangebyscore(regs[i][0], s, s, start=0, num=TIE_READ)
        for (i, _), got in zip(few, pipe.execute()):
            out[i] = sum(1 for m in got if as_bytes(m) >= cursor[1])
    # binary search: the ties in reverse order are those >= the cursor, then the others
    bounds = {i: [0, n] for i, n in zip(tied, counts) if n > TIE_READ}
    while any(lo < hi for lo, hi in bounds.values()):
        probing = [(i, (lo + hi) // 2) for i, (lo, hi) in bounds.items() if lo < hi]
        pipe = r.pipeline(transaction=False)
        for i, mid in probing:
            pipe.zrevrangebyscore(regs[i][0], s, s, start=mid, num=1)
        for (i, mid), got in zip(probing, pipe.execute()):
            if got and as_bytes(got[0]) >= cursor[1]:
                bounds[i][0] = mid + 1
            else:
                bounds[i][1] = mid
    out.update({i: lo for i, (lo, _) in bounds.items()})
    return out


class _Desc:
    """A heap key: the highest (score, member) first."""

    __slots__ = ("key",)

    def __init__(self, key: Cursor) -> None:
        self.key = key

    def __lt__(self, other: _Desc) -> bool:
        return self.key > other.key


class Merge:
    """The registries' entries after a cursor, highest (score, member) first: a k-way
    merge of one window of entries per registry, each read again (a window twice as
    large, up to CHUNK) only when its entries were all taken. A page reads about
    the entries it examines plus one small window per registry, however many
    registries (shards) and entries there are.

    A registry's next window starts after the last entry read, by score: at that
    score, past the entries of it already read (ties are ordered by member), so
    entries added or removed elsewhere meanwhile shift nothing."""

    def __init__(self, r: Client, regs: list[Registry], sizes: Sequence[int],
                 cursor: Cursor | None, created: tuple[float, float]) -> None:
        self.r, self.regs, self.cursor = r, regs, cursor
        hi = INF if cursor is None else cursor[0]
        self.ranges = [(min(hi, created[1]), created[0]) if by_created else (hi, -INF)
                       for _, _, by_created, _ in regs]
        live = [i for i, (top, low) in enumerate(self.ranges) if top >= low and sizes[i] > 0]
        tied = [i for i in live if cursor is not None and self.ranges[i][0] == cursor[0]
                and not regs[i][3]]
        #: where each registry's next window starts: at this score, past this many
        #: entries of it (those read already, or at or before the cursor)
        self.top = {i: self.ranges[i][0] for i in live}
        self.skip = dict.fromkeys(live, 0)
        if cursor is not None and tied:
            self.skip.update(_tie_offsets(r, regs, tied, cursor))
        self.window = dict.fromkeys(live, max(_MIN_WINDOW, min(CHUNK, 2 * PAGE_SIZE
                                                                // max(1, len(live)))))
        self.buffers: dict[int, list[Cursor]] = {i: [] for i in live}  # highest last
        self.more = set(live)  #: registries not read to their end
        self.heap: list[tuple[_Desc, int]] = []
        self._fill(live)

    def _fill(self, which: Sequence[int]) -> None:
        """Read the next window of each registry of ``which`` (one pipeline)."""
        pipe = self.r.pipeline(transaction=False)
        for i in which:
            if self.regs[i][3]:
                pipe.xrevrange(self.regs[i][0], _ms_bound(self.top[i], "+"),
                               _ms_bound(self.ranges[i][1], "-"), count=self.window[i])
            else:
                pipe.zrevrangebyscore(self.regs[i][0], _score(self.top[i]),
                                      _score(self.ranges[i][1]), start=self.skip[i],
                                      num=self.window[i], withscores=True)
        for i, got in zip(which, pipe.execute()):
            full = len(got) >= self.window[i]
            if not full:
                self.more.discard(i)
            self.window[i] = min(CHUNK, 2 * self.window[i])
            if self.regs[i][3]:
                entries = self._kept_entries(i, got, full)
            else:
                entries = [(float(score), as_bytes(member)) for member, score in got]
                self._advance(i, entries)
            if self.cursor is not None:  # entries written since at or before it
                entries = [e for e in entries if e < self.cursor]
            self.buffers[i] = entries[::-1]
            if entries:
                heapq.heappush(self.heap, (_Desc(entries[0]), i))
            elif i in self.more:
                self._fill([i])

    def _advance(self, i: int, entries: list[Cursor]) -> None:
        """Where a ZSET registry's next window starts, after ``entries``."""
        if entries:
            last = entries[-1][0]
            same = sum(1 for e in entries if e[0] == last)
            if same == len(entries) and last == self.top[i]:
                self.skip[i] += same  # still within the ties of one score
            else:
                self.top[i], self.skip[i] = last, same

    def _kept_entries(self, i: int, got: list[Any], full: bool) -> list[Cursor]:
        """A stream registry's window as (ms, job) entries, highest first: its last
        millisecond read whole (the rest of it read now), the next window starting
        at the millisecond below."""
        if full and got:
            last_id = as_bytes(got[-1][0]).decode()
            ms = int(last_id.partition("-")[0])
            rest: Any = self.r.xrevrange(self.regs[i][0], "(" + last_id, f"{ms}-0")
            got = list(got) + list(rest or [])
            self.top[i] = float(ms - 1)
            if self.top[i] < self.ranges[i][1]:
                self.more.discard(i)
        entries = [(float(as_bytes(eid).partition(b"-")[0]), job)
                   for eid, fields in got for job in as_bytes(fields.get(b"j", b"")).split()]
        return sorted(entries, reverse=True)

    def take(self, n: int) -> list[Candidate]:
        """The next ``n`` entries (fewer at the registries' end)."""
        out: list[Candidate] = []
        while len(out) < n and self.heap:
            _, i = heapq.heappop(self.heap)
            score, member = self.buffers[i].pop()
            out.append(Candidate(score, member, job_of(member), self.regs[i][1]))
            if self.buffers[i]:
                heapq.heappush(self.heap, (_Desc(self.buffers[i][-1]), i))
            elif i in self.more:  # its next entries may come before the others' heads
                self._fill([i])
        return out


