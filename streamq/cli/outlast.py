"""Commands that follow jobs for a while (``submit --wait``, ``subscribe``) outlast a
Redis restart, a failover or a busy moment: what they were doing is started again
once Redis answers, until their ``--timeout``; one line on stderr says they wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from streamq.base.keys import check_name
from streamq.base.models import JobStatus
from streamq.producer.client import Queue
from streamq.producer.job_store import find_job
from streamq.storage.connection import is_transient

from ..errors import JobNotFound
from .common import error_line

T = TypeVar("T")

#: seconds between attempts while Redis cannot serve
PAUSE_S = 0.5


def job_status(q: Queue, job_id: str) -> JobStatus:
    """The job's status (JobNotFound also when the job belongs to another queue); a lost
    connection raised as redis-py raises it, so that :func:`outlast` waits it out."""
    st = find_job(q, check_name("job id", job_id)).status()
    if st.queue != q.name:
        raise JobNotFound(job_id)
    return st


def outlast(attempt: Callable[[], T], deadline: float | None) -> T:
    """``attempt()``, made again while it fails with a transient Redis error, until
    ``deadline`` (time.monotonic(); None: for ever), after which the error is raised."""
    said = False
    while True:
        try:
            return attempt()
        except Exception as e:
            if not is_transient(e) or (deadline is not None and time.monotonic() >= deadline):
                raise
            if not said:
                error_line(f"Redis cannot serve ({e}): waiting for it")
                said = True
            time.sleep(PAUSE_S)
