"""The members and values stored inside streamq's keys: a job's tokens and who leases
them, a submit's intent, a lane's registry member, a dead letter's identity, and the
ids streamq makes for jobs. Each is a string with a separator that the ids around it
never hold; the key names themselves are :mod:`streamq.keys`'.
"""

from __future__ import annotations

import base64
import os

__all__ = ["dead_letter_key", "intent", "lane_member", "new_job_id", "new_job_ids", "owner",
           "owner_worker", "parse_intent", "parse_lane_member", "token", "token_job"]


def dead_letter_key(job_id: str, created_ms: int, field: str, serial: int) -> str:
    """Identity of one dead letter: its job (id and creation time: an id may be reused
    after its retention), its ``dlq`` field and its serial in the job (a sub-request
    replayed and dead-lettered again is a new dead letter)."""
    return f"{job_id}|{created_ms}|{field}|{serial}"


def intent(job_id: str, dedup: str = "") -> str:
    """A job's member of :attr:`QueueKeys.creating` (job ids never hold ``|``)."""
    return f"{job_id}|{dedup}" if dedup else job_id


def parse_intent(member: str) -> tuple[str, str]:
    """(job id, dedup key or "") of a :attr:`QueueKeys.creating` member."""
    job, _, dedup = member.partition("|")
    return job, dedup


def lane_member(priority: int, client: str) -> str:
    """A lane's member of :attr:`QueueKeys.lanes` (priorities never hold ``|``)."""
    return f"{priority}|{client}"


def parse_lane_member(member: str) -> tuple[int, str]:
    """(priority, client) of a :attr:`QueueKeys.lanes` member."""
    prio, _, client = member.partition("|")
    return int(prio), client


def token(job_id: str, i: int) -> str:
    """Name of a job's i-th token."""
    return f"{job_id}#{i}"


def token_job(tok: str) -> str:
    """Job id a token belongs to."""
    return tok.rpartition("#")[0]


def owner(worker_id: str, slot: int) -> str:
    """The ``owners`` value of a token leased by one slot of a worker."""
    return f"{worker_id}/{slot}"


def owner_worker(value: str) -> str:
    """The worker id of an ``owners`` value (``<worker id>/<slot>``)."""
    worker, sep, slot = value.rpartition("/")
    return worker if sep and slot.isdigit() else value


def new_job_ids(n: int) -> list[str]:
    """``n`` random job ids, 132 random bits each (uuid4().hex gives 122), from one
    read of the system's random source: base 64 in 22
    characters of a name (letters, digits, ``_`` and ``.``; none starts with ``-``,
    which a command line would read as an option). A retained small job keeps its id
    in three places: the short form saves 30 bytes of Redis memory against 32 hex
    digits."""
    pool = base64.b64encode(os.urandom(18 * n), altchars=b"_.")  # 18 bytes: 24 characters
    return [pool[i : i + 22].decode() for i in range(0, 24 * n, 24)]


def new_job_id() -> str:
    """One id of :func:`new_job_ids`."""
    return base64.b64encode(os.urandom(18), altchars=b"_.")[:22].decode()
