"""The Jobs view's reads: a page of jobs from the registries, filtered, newest first.

Jobs are found only through the queue's registries (``active`` and ``finished`` of
every shard, ``lactive``, ``ldone`` and the ``lkept`` stream for small jobs), read
with ZREVRANGEBYSCORE (XREVRANGE) a chunk at a time, never by scanning the keyspace. A page reads a job's own keys for
each candidate it examines (its row; a filter on state, client or priority is
checked there) and stops after :data:`EXAMINE_CAP` candidates, filtered or not: a
registry may hold entries that show nothing (jobs gone, or entries nobody
submitted: a producer's credential may record made-up finished jobs), and a page
costs a bounded number of reads whatever the registries hold; the page then says
how far it looked and offers the next cursor.

The merge of the registries, its cursor and its ties: :mod:`streamq.web.registry_merge`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from streamq.base.keys import JobKeys, QueueKeys, check_name
from streamq.ops import queue_rows
from streamq.producer import lane
from streamq.storage.connection import Client

from ..errors import StreamqError
from .registry_merge import (
    CHUNK,
    INF,
    PAGE_SIZE,
    Merge,
    Registry,
    as_bytes,
    format_cursor,
    job_of,
    parse_cursor,
)

#: Registry entries examined at most for one page (filtered or not).
EXAMINE_CAP = 1_000

UNFINISHED = ("open", "active", "scheduled")
FINISHED = ("succeeded", "partial", "failed", "aborted", "cancelled")
STATES = (*UNFINISHED, *FINISHED)



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


def _registries(shards: Sequence[QueueKeys], f: JobFilter) -> list[Registry]:
    """The registries to read for the filter: the unfinished ones are scored by
    registration (creation) time, the finished ones by forget-after time."""
    unfinished, finished = f.registries()
    out: list[Registry] = []
    for qk in shards:
        if unfinished:
            out += [(qk.active, False, True, False), (qk.lactive, True, True, False)]
        if finished:
            out += [(qk.finished, False, False, False), (qk.ldone, True, False, False),
                    (qk.lkept, True, False, True)]
    return out


def _sizes(r: Client, shards: Sequence[QueueKeys], regs: list[Registry]) -> list[Any]:
    """Entries of each registry (ZCARD, XLEN for a stream)."""
    pipe = r.pipeline(transaction=False)
    for key, _, _, stream in regs:
        (pipe.xlen if stream else pipe.zcard)(key)
    return pipe.execute()


def _kept_jobs(r: Client, shards: Sequence[QueueKeys]) -> int:
    """Finished small jobs ``lkept`` holds: records in ``ljobs`` that are neither
    unfinished (``lactive``) nor in ``ldone`` (an entry of ``lkept`` names many)."""
    pipe = r.pipeline(transaction=False)
    for qk in shards:
        pipe.hlen(qk.ljobs)
        pipe.zcard(qk.lactive)
        pipe.zcard(qk.ldone)
    got = [int(n) for n in pipe.execute()]
    return sum(max(0, got[k] - got[k + 1] - got[k + 2]) for k in range(0, len(got), 3))


def _job_row(jr: queue_rows.JobRow, small: bool = False) -> Row | None:
    return None if jr.state == "missing" else Row(
        jr.job_id, jr.state, jr.priority, jr.client, jr.total, jr.done, jr.failed,
        jr.in_flight, jr.queued, jr.created_ms, small)


def _big_rows(r: Client, queue: str, jobs: list[str]) -> dict[str, Row | None]:
    """Rows of big jobs; a job whose keys cannot be read as a job's shows nothing. A
    job with no meta (gone, or never made) costs one read, not a row's four."""
    out: dict[str, Row | None] = {}
    if jobs:
        pipe = r.pipeline(transaction=False)
        for j in jobs:
            pipe.exists(JobKeys(j, queue).meta)
        have = pipe.execute()
        out = {j: None for j, n in zip(jobs, have) if not n}
        jobs = [j for j, n in zip(jobs, have) if n]
    if not jobs:
        return out
    try:
        out.update({jr.job_id: _job_row(jr) for jr in queue_rows.job_rows(r, queue, jobs, idle=False)})
        return out
    except (ValueError, TypeError, KeyError, StreamqError):
        pass  # one job's keys are not a job's: read them one by one
    for j in jobs:
        try:
            out.update({jr.job_id: _job_row(jr) for jr in queue_rows.job_rows(r, queue, [j], idle=False)})
        except (ValueError, TypeError, KeyError, StreamqError):
            out[j] = None
    return out


def _small_rows(r: Client, shards: Sequence[QueueKeys], jobs: list[str]
                ) -> dict[str, Row | None]:
    """Rows of small jobs, read as the overview reads them (the entry a worker holds is
    in flight, as on the job lane); a record that is not a small job's shows nothing."""
    homes: dict[str, tuple[QueueKeys, list[str]]] = {}
    for j in jobs:
        home = lane.shard_of_job(list(shards), j)
        homes.setdefault(home.tag, (home, []))[1].append(j)
    out: dict[str, Row | None] = dict.fromkeys(jobs)
    for home, mine in homes.values():
        # a small job past its retention shows nothing, trimmed or not (lane.kept)
        kept = lane.kept_records(r, [(home, j) for j in mine])
        mine = [j for j, rec in zip(mine, kept) if rec is not None]
        try:
            got = queue_rows.small_rows(r, home, mine)
        except _UNREADABLE:  # one record is not a small job's: read them one by one
            got = []
            for j in mine:
                try:
                    got += queue_rows.small_rows(r, home, [j])
                except _UNREADABLE:
                    continue
        out.update({jr.job_id: _job_row(jr, True) for jr in got})
    return out


_UNREADABLE = (ValueError, TypeError, KeyError, AttributeError, StreamqError)


def rows_of(r: Client, shards: Sequence[QueueKeys], jobs: Sequence[tuple[str, bool]]
            ) -> list[Row | None]:
    """The rows of jobs (id, small), None for one that is gone or unreadable."""
    by_id = _big_rows(r, shards[0].name, [j for j, small in jobs if not small])
    by_id.update(_small_rows(r, shards, [j for j, small in jobs if small]))
    return [by_id.get(j) for j, _ in jobs]


def page(r: Client, shards: Sequence[QueueKeys], f: JobFilter, cursor_raw: str | None,
         now_ms: int) -> Page:
    """One page of the queue's jobs under filter ``f``, after ``cursor_raw``: at most
    PAGE_SIZE rows, from at most EXAMINE_CAP registry entries."""
    regs = _registries(shards, f)
    out = Page()
    sizes = [int(n) for n in _sizes(r, shards, regs)]
    out.total_registered = sum(n for n, reg in zip(sizes, regs) if not reg[3])
    out.total_registered += _kept_jobs(r, shards) if any(reg[3] for reg in regs) else 0
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
        chunk = CHUNK if f.reads_jobs else min(CHUNK, max(need, out.examined))
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
        job = None if got is None else job_of(as_bytes(got))
        if job is not None and job == _s(got):  # a job id, not anything stored there
            found.append(job)
    try:
        check_name("job id", term)
        found.insert(0, term)
    except StreamqError:  # not an id's shape: a dedup key only
        pass
    jobs: list[tuple[str, bool]] = []
    for j in dict.fromkeys(found):
        small = not r.exists(JobKeys(j, shards[0].name).meta)
        jobs.append((j, small))
    return [row for row in rows_of(r, shards, jobs) if row is not None]
