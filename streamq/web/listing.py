"""The Jobs view's reads: a page of jobs from the registries, filtered, newest first.

Jobs are found only through the queue's registries (``active`` and ``finished`` of
every shard, ``lactive`` and ``ldone`` for small jobs), read with ZREVRANGEBYSCORE a
chunk at a time, never by scanning the keyspace. A filter on what only a job's own
keys say (state, client, priority) reads them for one chunk of candidates at a time
and stops after :data:`EXAMINE_CAP` candidates, so a page costs a bounded number of
reads whatever the queue holds; the page then says how far it looked and offers the
next cursor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import inspect, lane
from ..connection import Client
from ..keys import JobKeys, QueueKeys, check_name
from ..models import JobStatus

#: Jobs shown on one page.
PAGE_SIZE = 50
#: Candidates examined at most for one filtered page.
EXAMINE_CAP = 5_000
#: Candidates read per round of a filtered page.
_CHUNK = 250

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
    examined: int = 0  #: candidates read for this page
    capped: bool = False  #: the filter stopped at EXAMINE_CAP before filling the page
    total_registered: int = 0  #: jobs in the registries read (ZCARD sums)


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


#: (registry key, holds small jobs, scored by the job's creation time)
Registry = tuple[str, bool, bool]


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
    return "+inf" if v == float("inf") else "-inf" if v == float("-inf") else f"{v:.0f}"


def parse_cursor(raw: str | None) -> tuple[float, str] | None:
    """A cursor ``<score>:<job id>`` (the last row shown), None for the first page."""
    if not raw:
        return None
    score, sep, job = raw.partition(":")
    try:
        return float(score), check_name("job id", job) if sep else ""
    except ValueError:
        return None
    except Exception:  # ConfigError: a malformed id
        return None


def _candidates(r: Client, regs: list[Registry], cursor: tuple[float, str] | None,
                created: tuple[float, float], n: int) -> list[tuple[float, str, bool]]:
    """The next ``n`` jobs after the cursor over every registry, highest score first
    (ties: greater id first), each registry read with a bounded ZREVRANGEBYSCORE;
    ``created`` bounds the scores of the registries scored by creation time."""
    hi = float("inf") if cursor is None else cursor[0]
    bounds = [(min(hi, created[1]), created[0]) if by_created else (hi, float("-inf"))
              for _, _, by_created in regs]
    ties = [0] * len(regs)
    if cursor is not None:
        # entries tied with the cursor's score (jobs registered in the same ms) come
        # before it or after it: ask for all of them too
        pipe = r.pipeline(transaction=False)
        for (key, _, _), (top, _) in zip(regs, bounds):
            pipe.zcount(key, _score(top), _score(top))
        ties = [int(t) for t in pipe.execute()]
    pipe = r.pipeline(transaction=False)
    for (key, _, _), extra, (top, low) in zip(regs, ties, bounds):
        pipe.zrevrangebyscore(key, _score(top), _score(low), start=0, num=n + extra,
                              withscores=True)
    found: list[tuple[float, str, bool]] = []
    for (_, small, _), got in zip(regs, pipe.execute()):
        for member, score in got:
            job = _s(member).partition("|")[0]  # finished: "<job>|<token>"
            if cursor is not None and (score, job) >= cursor:
                continue
            found.append((float(score), job, small))
    found.sort(reverse=True)
    return found[:n]


def rows_of(r: Client, shards: Sequence[QueueKeys], jobs: Sequence[tuple[str, bool]]
            ) -> list[Row | None]:
    """The rows of jobs (id, small), None for one that is gone."""
    big = [j for j, small in jobs if not small]
    by_id: dict[str, Row | None] = {}
    for jr in inspect.job_rows(r, big, idle=False):
        by_id[jr.job_id] = None if jr.state == "missing" else Row(
            jr.job_id, jr.state, jr.priority, jr.client, jr.total, jr.done, jr.failed,
            jr.in_flight, jr.queued, jr.created_ms, False)
    small = [j for j, is_small in jobs if is_small]
    if small:
        pipe = r.pipeline(transaction=False)
        for j in small:
            pipe.hget(lane.shard_of_job(list(shards), j).ljobs, j)
        for j, rec in zip(small, pipe.execute()):
            by_id[j] = None if rec is None else _small_row(lane.status(j, lane.parse(rec)))
    return [by_id.get(j) for j, _ in jobs]


def _small_row(st: JobStatus) -> Row:
    return Row(st.job_id, st.state.value, st.priority, st.client, st.total, st.done, st.failed,
               st.in_flight, st.queued, st.created_ms, True)


def page(r: Client, shards: Sequence[QueueKeys], f: JobFilter, cursor_raw: str | None,
         now_ms: int) -> Page:
    """One page of the queue's jobs under filter ``f``, after ``cursor_raw``."""
    regs = _registries(shards, f)
    out = Page()
    pipe = r.pipeline(transaction=False)
    for key, _, _ in regs:
        pipe.zcard(key)
    out.total_registered = sum(int(n) for n in pipe.execute())
    if f.search:
        out.rows = search(r, shards, f.search)
        return out
    # the creation times the age filter allows (the bounds of the registries scored
    # by creation; the others are checked job by job)
    created = (float("-inf") if f.max_age_s is None else now_ms - f.max_age_s * 1000,
               float("inf") if f.min_age_s is None else now_ms - f.min_age_s * 1000)
    cursor = parse_cursor(cursor_raw)
    want = PAGE_SIZE
    while len(out.rows) < want:
        chunk = _CHUNK if f.reads_jobs else want - len(out.rows)
        got = _candidates(r, regs, cursor, created, chunk)
        if not got:
            out.next_cursor = None
            return out
        rows = rows_of(r, shards, [(j, small) for _, j, small in got])
        for (score, job, _), row in zip(got, rows):
            out.examined += 1
            cursor = (score, job)
            if row is not None and f.matches(row, now_ms):
                out.rows.append(row)
                if len(out.rows) == want:
                    break
        if f.reads_jobs and out.examined >= EXAMINE_CAP and len(out.rows) < want:
            out.capped = True
            break
    out.next_cursor = f"{cursor[0]:.0f}:{cursor[1]}" if cursor is not None else None
    return out


def search(r: Client, shards: Sequence[QueueKeys], term: str) -> list[Row]:
    """The job whose id is ``term``, and the job its dedup key names, if any."""
    term = term.strip()
    found: list[str] = []
    pipe = r.pipeline(transaction=False)
    for qk in shards:
        pipe.hget(qk.dedup, term)
    for got in pipe.execute():
        if got is not None:
            found.append(_s(got))
    try:
        check_name("job id", term)
        found.insert(0, term)
    except Exception:  # not an id's shape: a dedup key only
        pass
    jobs: list[tuple[str, bool]] = []
    for j in dict.fromkeys(found):
        small = not r.exists(JobKeys(j).meta)
        jobs.append((j, small))
    return [row for row in rows_of(r, shards, jobs) if row is not None]
