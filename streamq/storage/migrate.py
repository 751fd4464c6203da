"""Moving jobs stored under the key layout of earlier releases.

A job's keys were ``sq:{<job id>}:<part>`` before, one namespace of job ids
for every queue of a server; they are ``sq:{<queue>/<job id>}:<part>`` now
(:class:`streamq.base.keys.JobKeys`), so each queue has its own job ids. ``streamq
setup`` moves every job it finds under the old layout (its meta names its queue) to
the new one: each key is copied with DUMP and RESTORE (its time to live kept) and then
deleted, the meta last, so a move cut short and run again finishes. A key already
there under the new layout is never replaced (a second mover, or the work of a new
worker, wins): the old copy is deleted. A process that loads a new library itself
(a user that may load code) moves them first (:func:`streamq.storage.functions.load`),
so a new worker or reaper never meets an old job as an orphan. Run it after the old
workers stopped and before the new ones start (the upgrade's order,
docs/operations.md): a job moved under a running old worker would be served twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis

from streamq.base.config import PREFIX
from streamq.base.keys import JOB_SEP, JobKeys, shard_queue
from streamq.errors import ConfigError
from streamq.storage.wire import Client

__all__ = ["PARTS", "move_job", "move_old_jobs", "old_jobs"]

#: the parts of a job's keys, the meta last (the move's marker: a job whose meta is
#: still under the old layout is found again by the next setup)
PARTS = tuple(sorted(p for p, v in vars(JobKeys).items()
                     if isinstance(v, property) and p != "tag" and p != "meta")) + ("meta",)


def old_jobs(client: Client) -> Iterator[tuple[str, str]]:
    """(job id, queue) of every job whose keys are under the old layout."""
    for raw in client.scan_iter(match=f"{PREFIX}:{{*}}:meta", count=1000):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        job = key[len(PREFIX) + 2:-len("}:meta")]
        if JOB_SEP in job:
            continue  # the layout of this release
        tag: Any = client.hget(key, "queue")
        if tag is None:
            continue  # not a job's meta (or gone meanwhile)
        try:
            yield JobKeys(job, shard_queue(tag.decode())).job_id, shard_queue(tag.decode())
        except ConfigError:
            continue  # not a job's id or queue: not streamq's job


def move_job(client: Client, job: str, queue: str) -> int:
    """Move one job's keys to the layout of this release; the keys moved."""
    new, moved = JobKeys(job, queue), 0
    for part in PARTS:
        old = f"{PREFIX}:{{{job}}}:{part}"
        dumped: Any = client.dump(old)
        ttl: Any = client.pttl(old)
        if dumped is None or ttl == -2:
            continue  # none, or expired between the two reads
        # -1: no expiry (RESTORE's 0); 0 or less left: about to expire, 1 ms then
        life = 0 if ttl == -1 else max(int(ttl), 1)
        try:
            client.restore(getattr(new, part), life, dumped)
            moved += 1
        except redis.ResponseError as e:
            if "BUSYKEY" not in str(e):
                raise
            # there already (a move cut short, or another mover): that copy wins
        client.delete(old)
    return moved


def move_old_jobs(client: Client) -> int:
    """Move every job of the old layout (see the module); how many were moved."""
    return sum(1 for job, queue in list(old_jobs(client)) if move_job(client, job, queue))
