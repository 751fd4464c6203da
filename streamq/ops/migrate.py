"""Moving jobs stored under the key layout of earlier releases.

A job's keys were ``sq:{<job id>}:<part>`` before, one namespace of job ids
for every queue of a server; they are ``sq:{<queue>/<job id>}:<part>`` now
(:class:`streamq.base.keys.JobKeys`), so each queue has its own job ids. ``streamq
setup`` moves every job it finds under the old layout (its meta names its queue) to
the new one: each key is copied with DUMP and RESTORE (its time to live kept) and then
deleted, the meta last, so a setup cut short and run again finishes the move. Run it
after the old workers stopped and before the new ones start (the upgrade's order,
docs/operations.md): a job moved under a running old worker would be served twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streamq.base.config import PREFIX
from streamq.base.keys import JOB_SEP, JobKeys, shard_queue
from streamq.errors import ConfigError
from streamq.storage.connection import Client

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
        if dumped is None:
            continue
        ttl: Any = client.pttl(old)
        if ttl == -2:
            continue  # expired between the two reads
        client.restore(getattr(new, part), max(int(ttl), 0), dumped, replace=True)
        client.delete(old)
        moved += 1
    return moved


def move_old_jobs(client: Client) -> int:
    """Move every job of the old layout (see the module); how many were moved."""
    jobs = list(old_jobs(client))
    for job, queue in jobs:
        move_job(client, job, queue)
    return len(jobs)
