"""The Jobs view's reads: a page of jobs from the registries, filtered, newest first.

Jobs are found only through the queue's registries (``active`` and ``finished`` of
every shard, ``lactive`` and ``ldone`` for small jobs), read with ZREVRANGEBYSCORE a
chunk at a time, never by scanning the keyspace. A page reads a job's own keys for
each candidate it examines (its row; a filter on state, client or priority is
checked there) and stops after :data:`EXAMINE_CAP` candidates, filtered or not: a
registry may hold entries that show nothing (jobs gone, or entries nobody
submitted: a producer's credential may record made-up finished jobs), and a page
costs a bounded number of reads whatever the registries hold; the page then says
how far it looked and offers the next cursor.

The cursor is the last entry examined (its score and member). Entries tied with it
(one score: jobs registered, or finished, in the same millisecond) are found by
position: a registry's ties are ordered by member, so the cursor's place among them
is read whole when they are few (:data:`TIE_READ`), else searched one entry per probe
(a binary search), never by reading every tie.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import lane, queue_overview
from ..connection import Client
from ..errors import StreamqError
from ..keys import JobKeys, QueueKeys, check_name
from ..models import JobStatus

#: Jobs shown on one page.
PAGE_SIZE = 50
#: Registry entries examined at most for one page (filtered or not).
EXAMINE_CAP = 1_000
#: Candidates read per round of a filtered page (and at most per round of any page).
_CHUNK = 250
#: Entries tied with the cursor's score read whole to find its place among them; a
#: registry with more is searched instead (one entry per probe).
TIE_READ = 250
#: Entries of a registry read at first for a page (more when there are few
#: registries: 2 * PAGE_SIZE over them, up to _CHUNK); a window taken whole is read
#: again twice as large.
_MIN_WINDOW = 8
#: Characters of a cursor accepted (a longer one starts at the first page).
_CURSOR_MAX = 1_024

UNFINISHED = ("open", "active", "scheduled")
FINISHED = ("succeeded", "partial", "failed", "aborted", "cancelled")
STATES = (*UNFINISHED, *FINISHED)

INF = float("inf")


@dataclass(frozen=True)
class JobFilter:
    """What the Jobs view asks for; every field optional."""

    state: str | None = None
    client: str | None = None
    priority: int | None = None
    min_age_s: float | None = None  #: created (finished jobs: finished) at least this long ago
    max_age_s: float | None = None
    search: str | None = None  #: a job id or a dedup key

    def registries(self) -> tuple[bool, bool]:
        """(read the unfinished registries, read the finished ones)."""
        if self.state in UNFINISHED:
            return True, False
        if self.state in FINISHED:
            return False, True
        return True, True

    def matches(self, row: Row, now_ms: int) -> bool:
        age_s = (now_ms - row.created_ms) / 1000
        return ((self.state is None or row.state == self.state)
                and (self.client is None or row.client == self.client)
                and (self.priority is None or row.priority == self.priority)
                and (self.min_age_s is None or age_s >= self.min_age_s)
                and (self.max_age_s is None or age_s <= self.max_age_s))

    @property
    def reads_jobs(self) -> bool:
        """The filter needs each candidate's own keys (not only its registry score:
        a finished registry is scored by the time its job is forgotten, not created)."""
        aged = self.min_age_s is not None or self.max_age_s is not None
        return (self.state is not None or self.client is not None
                or self.priority is not None or (aged and self.registries()[1]))


@dataclass(frozen=True)
class Row:
    """One job of a page."""

    job_id: str
    state: str
    priority: int
    client: str
    total: int
    done: int
    failed: int
    in_flight: int
    queued: int
    created_ms: int
    small: bool  #: a small job (the lane)


@dataclass
class Page:
    rows: list[Row] = field(default_factory=list)
    next_cursor: str | None = None  #: where the next page starts (None: no more)
    examined: int = 0  #: registry entries examined for this page
    #: entries examined that show no job: gone, unreadable, not a job id, or a second
    #: entry of a job shown already
    skipped: int = 0
    capped: bool = False  #: the page stopped at EXAMINE_CAP before filling up
    total_registered: int = 0  #: jobs in the registries read (ZCARD sums)


def _s(v: Any) -> str:
    return v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v)


def _b(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode()


#: (registry key, holds small jobs, scored by the job's creation time)
Registry = tuple[str, bool, bool]
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


def _registries(shards: Sequence[QueueKeys], f: JobFilter) -> list[Registry]:
    """The registries to read for the filter: the unfinished ones are scored by
    registration (creation) time, the finished ones by forget-after time."""
    unfinished, finished = f.registries()
    out: list[Registry] = []
    for qk in shards:
        if unfinished:
            out += [(qk.active, False, True), (qk.lactive, True, True)]
        if finished:
            out += [(qk.finished, False, False), (qk.ldone, True, False)]
    return out


def _score(v: float) -> str:
    """A score as Redis reads it back exactly (``repr`` of a float round-trips)."""
    return "+inf" if v == INF else "-inf" if v == -INF else repr(float(v))


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


def _job_of(member: bytes) -> str | None:
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
            out[i] = sum(1 for m in got if _b(m) >= cursor[1])
    # binary search: the ties in reverse order are those >= the cursor, then the others
    bounds = {i: [0, n] for i, n in zip(tied, counts) if n > TIE_READ}
    while any(lo < hi for lo, hi in bounds.values()):
        probing = [(i, (lo + hi) // 2) for i, (lo, hi) in bounds.items() if lo < hi]
        pipe = r.pipeline(transaction=False)
        for i, mid in probing:
            pipe.zrevrangebyscore(regs[i][0], s, s, start=mid, num=1)
        for (i, mid), got in zip(probing, pipe.execute()):
            if got and _b(got[0]) >= cursor[1]:
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
    large, up to _CHUNK) only when its entries were all taken. A page reads about
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
                       for _, _, by_created in regs]
        live = [i for i, (top, low) in enumerate(self.ranges) if top >= low and sizes[i] > 0]
        tied = [i for i in live if cursor is not None and self.ranges[i][0] == cursor[0]]
        #: where each registry's next window starts: at this score, past this many
        #: entries of it (those read already, or at or before the cursor)
        self.top = {i: self.ranges[i][0] for i in live}
        self.skip = dict.fromkeys(live, 0)
        if cursor is not None and tied:
            self.skip.update(_tie_offsets(r, regs, tied, cursor))
        self.window = dict.fromkeys(live, max(_MIN_WINDOW, min(_CHUNK, 2 * PAGE_SIZE
                                                                // max(1, len(live)))))
        self.buffers: dict[int, list[Cursor]] = {i: [] for i in live}  # highest last
        self.more = set(live)  #: registries not read to their end
        self.heap: list[tuple[_Desc, int]] = []
        self._fill(live)

    def _fill(self, which: Sequence[int]) -> None:
        """Read the next window of each registry of ``which`` (one pipeline)."""
        pipe = self.r.pipeline(transaction=False)
        for i in which:
            pipe.zrevrangebyscore(self.regs[i][0], _score(self.top[i]),
                                  _score(self.ranges[i][1]), start=self.skip[i],
                                  num=self.window[i], withscores=True)
        for i, got in zip(which, pipe.execute()):
            if len(got) < self.window[i]:
                self.more.discard(i)
            self.window[i] = min(_CHUNK, 2 * self.window[i])
            entries = [(float(score), _b(member)) for member, score in got]
            if entries:
                last = entries[-1][0]
                same = sum(1 for e in entries if e[0] == last)
                if same == len(entries) and last == self.top[i]:
                    self.skip[i] += same  # still within the ties of one score
                else:
                    self.top[i], self.skip[i] = last, same
            if self.cursor is not None:  # entries written since at or before it
                entries = [e for e in entries if e < self.cursor]
            self.buffers[i] = entries[::-1]
            if entries:
                heapq.heappush(self.heap, (_Desc(entries[0]), i))
            elif i in self.more:
                self._fill([i])

    def take(self, n: int) -> list[Candidate]:
        """The next ``n`` entries (fewer at the registries' end)."""
        out: list[Candidate] = []
        while len(out) < n and self.heap:
            _, i = heapq.heappop(self.heap)
            score, member = self.buffers[i].pop()
            out.append(Candidate(score, member, _job_of(member), self.regs[i][1]))
            if self.buffers[i]:
                heapq.heappush(self.heap, (_Desc(self.buffers[i][-1]), i))
            elif i in self.more:  # its next entries may come before the others' heads
                self._fill([i])
        return out


def _job_row(jr: queue_overview.JobRow) -> Row | None:
    return None if jr.state == "missing" else Row(
        jr.job_id, jr.state, jr.priority, jr.client, jr.total, jr.done, jr.failed,
        jr.in_flight, jr.queued, jr.created_ms, False)


def _big_rows(r: Client, jobs: list[str]) -> dict[str, Row | None]:
    """Rows of big jobs; a job whose keys cannot be read as a job's shows nothing. A
    job with no meta (gone, or never made) costs one read, not a row's four."""
    out: dict[str, Row | None] = {}
    if jobs:
        pipe = r.pipeline(transaction=False)
        for j in jobs:
            pipe.exists(JobKeys(j).meta)
        have = pipe.execute()
        out = {j: None for j, n in zip(jobs, have) if not n}
        jobs = [j for j, n in zip(jobs, have) if n]
    if not jobs:
        return out
    try:
        out.update({jr.job_id: _job_row(jr) for jr in queue_overview.job_rows(r, jobs, idle=False)})
        return out
    except (ValueError, TypeError, KeyError, StreamqError):
        pass  # one job's keys are not a job's: read them one by one
    for j in jobs:
        try:
            out.update({jr.job_id: _job_row(jr) for jr in queue_overview.job_rows(r, [j], idle=False)})
        except (ValueError, TypeError, KeyError, StreamqError):
            out[j] = None
    return out


def rows_of(r: Client, shards: Sequence[QueueKeys], jobs: Sequence[tuple[str, bool]]
            ) -> list[Row | None]:
    """The rows of jobs (id, small), None for one that is gone or unreadable."""
    by_id = _big_rows(r, [j for j, small in jobs if not small])
    small = [j for j, is_small in jobs if is_small]
    if small:
        pipe = r.pipeline(transaction=False)
        for j in small:
            pipe.hget(lane.shard_of_job(list(shards), j).ljobs, j)
        for j, rec in zip(small, pipe.execute()):
            try:
                by_id[j] = None if rec is None else _small_row(lane.status(j, lane.parse(rec)))
            except (ValueError, TypeError, KeyError, AttributeError, StreamqError):
                by_id[j] = None  # not a small job's record
    return [by_id.get(j) for j, _ in jobs]


def _small_row(st: JobStatus) -> Row:
    return Row(st.job_id, st.state.value, st.priority, st.client, st.total, st.done, st.failed,
               st.in_flight, st.queued, st.created_ms, True)


def page(r: Client, shards: Sequence[QueueKeys], f: JobFilter, cursor_raw: str | None,
         now_ms: int) -> Page:
    """One page of the queue's jobs under filter ``f``, after ``cursor_raw``: at most
    PAGE_SIZE rows, from at most EXAMINE_CAP registry entries."""
    regs = _registries(shards, f)
    out = Page()
    pipe = r.pipeline(transaction=False)
    for key, _, _ in regs:
        pipe.zcard(key)
    sizes = [int(n) for n in pipe.execute()]
    out.total_registered = sum(sizes)
    if f.search:
        out.rows = search(r, shards, f.search)
        return out
    # the creation times the age filter allows (the bounds of the registries scored
    # by creation; the others are checked job by job)
    created = (-INF if f.max_age_s is None else now_ms - f.max_age_s * 1000,
               INF if f.min_age_s is None else now_ms - f.min_age_s * 1000)
    cursor = parse_cursor(cursor_raw)
    merge = Merge(r, regs, sizes, cursor, created)
    shown: set[str] = set()
    while len(out.rows) < PAGE_SIZE:
        room = EXAMINE_CAP - out.examined
        if room <= 0:
            out.capped = True
            break
        need = PAGE_SIZE - len(out.rows)
        # a filter reads a chunk a round; without one, a page's worth, more once
        # entries showed nothing (doubling: a bounded number of rounds)
        chunk = _CHUNK if f.reads_jobs else min(_CHUNK, max(need, out.examined))
        got = merge.take(min(chunk, room))
        if not got:
            out.next_cursor = None
            return out
        jobs = list(dict.fromkeys((c.job, c.small) for c in got
                                  if c.job is not None and c.job not in shown))
        rows = dict(zip(jobs, rows_of(r, shards, jobs)))
        for c in got:
            out.examined += 1
            cursor = (c.score, c.member)
            row = None if c.job is None or c.job in shown else rows.get((c.job, c.small))
            if row is None:
                out.skipped += 1
                continue
            shown.add(row.job_id)
            if f.matches(row, now_ms):
                out.rows.append(row)
                if len(out.rows) == PAGE_SIZE:
                    break
    out.next_cursor = format_cursor(cursor) if cursor is not None else None
    return out


def search(r: Client, shards: Sequence[QueueKeys], term: str) -> list[Row]:
    """The job whose id is ``term``, and the job its dedup key names, if any."""
    term = term.strip()
    found: list[str] = []
    pipe = r.pipeline(transaction=False)
    for qk in shards:
        pipe.hget(qk.dedup, term)
    for got in pipe.execute():
        job = None if got is None else _job_of(_b(got))
        if job is not None and job == _s(got):  # a job id, not anything stored there
            found.append(job)
    try:
        check_name("job id", term)
        found.insert(0, term)
    except StreamqError:  # not an id's shape: a dedup key only
        pass
    jobs: list[tuple[str, bool]] = []
    for j in dict.fromkeys(found):
        small = not r.exists(JobKeys(j).meta)
        jobs.append((j, small))
    return [row for row in rows_of(r, shards, jobs) if row is not None]
