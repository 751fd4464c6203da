"""The ticker: submits the due ticks of a queue's repeats (:mod:`streamq.producer.
repeating`), once each however many processes tick.

Every process that runs recovery passes ticks: a reaper (every second beside its
passes, and at the start of each) and a worker's recovery thread. A tick is due
when its time in ``repeat-next`` is past by Redis's clock. For each due tick the
ticker submits the repeat's job under the tick's own job id (``<queue>.<repeat>.
<tick ms>``: a submit of an existing id makes nothing new), then moves the repeat
to its next tick with ``repeat_advance``, a compare-and-set on the tick it read:

- two tickers on one tick both submit the same job id: one job; one advance wins;
- a ticker killed between its submit and its advance leaves the tick due: the next
  ticker's submit finds the job, and it advances;
- a repeat paused, removed or replaced after the read is not advanced (its next
  tick is no longer the one read); a removed one is not submitted again.

Missed ticks are not made up: the next tick is the first after the later of the
tick submitted and now.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from streamq.errors import ConfigError, ConnectionFailed, StreamqError
from streamq.services.repeats import RepeatSpec, next_tick, tick_job_id
from streamq.storage.connection import server_ms

if TYPE_CHECKING:
    from streamq.producer.client import Queue

__all__ = ["tick_repeats"]

log = logging.getLogger("streamq.repeats")

#: due ticks one call takes at most (the rest wait for the next call)
TICK_LIMIT = 100


def tick_repeats(q: Queue, limit: int = TICK_LIMIT) -> int:
    """Submit the due ticks of queue ``q``'s repeats and advance them; return the jobs
    this call created (a tick another ticker submitted first counts 0)."""
    qk = q.keys
    now = server_ms(q.redis, qk.repeat_next)
    due: Any = q.redis.zrangebyscore(qk.repeat_next, "-inf", now, start=0, num=limit,
                                withscores=True)
    if not due:
        return 0
    specs: Any = q.redis.hmget(qk.repeats, [n for n, _ in due])
    created = 0
    for (raw_name, score), raw in zip(due, specs):
        if raw is None:
            continue  # removed since the read
        name, tick = raw_name.decode(), int(score)
        try:
            spec = RepeatSpec.from_json(raw)
        except ConfigError as e:
            log.error("repeat %s of queue %s is not readable, it is skipped: %s", name, qk.name, e)
            continue
        created += _submit(q, spec, name, tick)
        after = next_tick(spec, max(tick, now))
        q.scripts.run("repeat_advance", (qk.repeats, qk.repeat_next, qk.repeat_last),
                      (name, tick, after))
    return created


def _submit(q: Queue, spec: RepeatSpec, name: str, tick: int) -> int:
    """Submit one tick's job; 1 when this call created it. A refusal that is no Redis
    blip (the id taken by a job of another queue, a payload over the queue's limit) is
    logged and the tick skipped; transient errors propagate (the tick stays due)."""
    job_id = tick_job_id(q.keys.name, name, tick)
    try:
        job = q.submit(spec.payloads, job_id=job_id, priority=spec.priority,
                       concurrency=spec.concurrency, client=spec.client,
                       max_deliveries=spec.max_deliveries, timeout=spec.timeout)
    except ConnectionFailed:
        raise  # Redis away (or refusing us): the tick stays due
    except StreamqError as e:
        at = datetime.fromtimestamp(tick / 1000, UTC).isoformat()
        log.error("repeat %s of queue %s: its tick at %s was not submitted: %s",
                  name, q.keys.name, at, e)
        return 0
    if job.created:
        log.debug("repeat %s of queue %s submitted job %s", name, q.keys.name, job_id)
    return int(job.created)
