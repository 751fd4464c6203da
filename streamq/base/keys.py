"""The single source of every Redis key and channel name streamq uses.

Queue keys carry the hash tag ``{queue}`` and job keys the hash tag ``{job id}``,
so each Lua script touches one cluster slot: the queue's or the job's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from streamq.base.config import PREFIX
from streamq.errors import ConfigError

_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


def check_name(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid queue name or job id, else raise ConfigError."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(
            f"invalid {kind} {value!r}: use 1-128 characters from A-Z a-z 0-9 _ . : -"
        )
    return value


def check_client(value: str) -> str:
    """Return ``value`` if it is a valid client name, else raise ConfigError: a name
    (:func:`check_name`) that does not end with ``:retry`` (a client's lane stream
    ``lane:<prio>:<client>`` would then be another client's retry set)."""
    check_name("client name", value)
    if value.endswith(":retry"):
        raise ConfigError(f"invalid client name {value!r}: it may not end with ':retry'")
    return value


#: SET of queue names, added to by every process that loads a queue's shards (the
#: dashboard's list of queues); a key of its own hash slot, written outside scripts
QUEUES = f"{PREFIX}:queues"

#: the separator of a job's hash tag: ``<queue>/<job>`` (never in a name)
JOB_SEP = "/"

#: the separator of a shard's hash tag: ``<queue>~<n>`` (never in a queue name)
SHARD_SEP = "~"


def shard_queue(tag: str) -> str:
    """The queue name of a shard's hash tag (the meta ``queue`` field of a job)."""
    return tag.partition(SHARD_SEP)[0]


@dataclass(frozen=True)
class QueueKeys:
    """Keys of one queue shard; all share its cluster slot.

    ``tag`` is the shard's hash tag: the queue's name for its first shard (the
    only one of a queue on one server), ``<queue>~<n>`` for the others
    (:mod:`streamq.shards`). A job's keys never depend on its shard.
    """

    name: str
    tag: str = ""

    def __post_init__(self) -> None:
        check_name("queue name", self.name)
        if not self.tag:
            object.__setattr__(self, "tag", self.name)
        elif self.tag != self.name:
            queue, sep, n = self.tag.partition(SHARD_SEP)
            if queue != self.name or not sep or not n.isdigit():
                raise ConfigError(f"invalid shard {self.tag!r} of queue {self.name!r}")

    def _k(self, part: str) -> str:
        return f"{PREFIX}:{{{self.tag}}}:{part}"

    @cached_property
    def config(self) -> str:
        """HASH of the queue's stored configuration (``shards``: its shard tags), in
        its first shard's slot."""
        return f"{PREFIX}:{{{self.name}}}:config"

    @cached_property
    def rates(self) -> str:
        """HASH ``queue`` | ``client:<name>`` -> ``<per second>|<burst>``: the queue's rate
        limits (:mod:`streamq.rates`), in its first shard's slot."""
        return f"{PREFIX}:{{{self.name}}}:rates"

    @cached_property
    def buckets(self) -> str:
        """HASH, same fields as :attr:`rates` -> ``<tokens>|<ms>``: each limit's token
        bucket, in the queue's first shard's slot."""
        return f"{PREFIX}:{{{self.name}}}:buckets"

    @cached_property
    def repeats(self) -> str:
        """HASH repeat name -> its spec (JSON, :mod:`streamq.services.repeats`): the
        queue's repeating jobs, in its first shard's slot."""
        return f"{PREFIX}:{{{self.name}}}:repeats"

    @cached_property
    def repeat_next(self) -> str:
        """ZSET repeat name -> its next tick (epoch ms); a paused repeat has none."""
        return f"{PREFIX}:{{{self.name}}}:repeat-next"

    @cached_property
    def repeat_last(self) -> str:
        """ZSET repeat name -> the last tick submitted (epoch ms)."""
        return f"{PREFIX}:{{{self.name}}}:repeat-last"

    @cached_property
    def ready(self) -> str:
        """ZSET token -> score (priority, then fairness rank); lower is served first."""
        return self._k("ready")

    @cached_property
    def leased(self) -> str:
        """ZSET token -> lease deadline (ms since the epoch)."""
        return self._k("leased")

    @cached_property
    def parked(self) -> str:
        """ZSET token -> score, tokens whose job has nothing deliverable now."""
        return self._k("parked")

    @cached_property
    def tokens(self) -> str:
        """HASH token -> its score; a token exists while its job is unfinished."""
        return self._k("tokens")

    @cached_property
    def owners(self) -> str:
        """HASH token -> id of the worker holding its lease."""
        return self._k("owners")

    @cached_property
    def kick(self) -> str:
        """HASH token -> 1, set when a leased token's job got work (park goes to ready)."""
        return self._k("kick")

    @cached_property
    def active(self) -> str:
        """ZSET job id -> registration time (ms): the registry of unfinished jobs."""
        return self._k("active")

    @cached_property
    def finished(self) -> str:
        """ZSET job id -> completion time (ms), kept for the retention period."""
        return self._k("finished")

    @cached_property
    def fair(self) -> str:
        """HASH ``<priority>:<client>`` -> last rank given; ``<priority>`` -> rank last claimed."""
        return self._k("fair")

    @cached_property
    def dedup(self) -> str:
        """HASH dedup key -> job id."""
        return self._k("dedup")

    @cached_property
    def dedup_expiry(self) -> str:
        """ZSET dedup key -> time (ms) after which it is forgotten."""
        return self._k("dedupx")

    @cached_property
    def creating(self) -> str:
        """ZSET intent -> time written (ms): jobs whose create was sent and whose
        registration (or finish) is not done yet. An intent is the job id, or
        ``<job>|<dedup key>`` for a job with a dedup key (see :func:`intent`)."""
        return self._k("creating")

    @cached_property
    def workers(self) -> str:
        """ZSET worker id -> heartbeat deadline (ms)."""
        return self._k("workers")

    def worker(self, worker_id: str) -> str:
        """HASH describing one worker (host, pid, started, processed)."""
        return self._k(f"worker:{worker_id}")

    @cached_property
    def retries(self) -> str:
        """ZSET job id -> due time (ms) of its earliest retry: live workers promote it then."""
        return self._k("retries")

    @cached_property
    def wake(self) -> str:
        """LIST of wake-up signals idle workers block on."""
        return self._k("wake")

    @cached_property
    def paused(self) -> str:
        """STRING holding the pause's id while the shard is paused (``Queue.pause``)."""
        return self._k("paused")

    @cached_property
    def stats(self) -> str:
        """STREAM of what the workers did, one entry per heartbeat that had something to
        report (sub-requests started, finished, failed; queue-wait histogram buckets);
        written by the heartbeats on the queue's first shard, trimmed to a little more
        than an hour (:mod:`streamq.history`)."""
        return self._k("stats")

    @cached_property
    def events(self) -> str:
        """STREAM of completion records, the durable twin of the pub/sub channels."""
        return self._k("events")

    @cached_property
    def reaping(self) -> str:
        """HASH of the reapers' watch: ``last`` (ms of the last ``reap_leases``), ``from``
        and ``to`` (ms: the last gap no reaper watched, when Redis or every reaper was
        away); deaths and lapses are judged on watched time only."""
        return self._k("reaping")

    @cached_property
    def reaper_lock(self) -> str:
        """STRING holder id with a TTL: one reaper pass at a time."""
        return self._k("reaper-lock")

    @cached_property
    def dead(self) -> str:
        """STREAM of dead letters."""
        return self._k("dead")

    @cached_property
    def owed(self) -> str:
        """ZSET job id -> finish time (ms): finished jobs that recorded dead letters and
        may still owe their announcement in :attr:`dead` (the reaper repairs each)."""
        return self._k("owed")

    def announced(self, letter: str) -> str:
        """STRING with a TTL: the :attr:`dead` entry id of dead letter ``letter``
        (:func:`dead_letter_key`), so it is announced once."""
        return self._k(f"announced:{letter}")

    def replayed(self, letter: str) -> str:
        """STRING with a TTL: ``<token>|<target job>`` of the one replay of dead letter
        ``letter`` (:func:`dead_letter_key`)."""
        return self._k(f"replayed:{letter}")

    def replayed_entry(self, entry_id: str) -> str:
        """STRING with a TTL: the same as :meth:`replayed`, by the :attr:`dead` entry id."""
        return self._k(f"replayed-id:{entry_id}")

    # -- the small-job lane (streamq.lane): jobs of one sub-request, kept in this slot --

    @cached_property
    def lanes(self) -> str:
        """ZSET ``<priority>|<client>`` -> priority: the lane streams of this shard."""
        return self._k("lanes")

    def lane(self, priority: int, client: str) -> str:
        """STREAM (+ consumer group) of the small jobs of one priority and client."""
        return self._k(f"lane:{priority}:{client}")

    def lane_retry(self, priority: int, client: str) -> str:
        """ZSET ``<attempts>|<job>|<type><payload>`` -> due ms: retries of one lane."""
        return self._k(f"lane:{priority}:{client}:retry")

    @cached_property
    def ljobs(self) -> str:
        """HASH job id -> JSON record of a small job (settings, state, counters)."""
        return self._k("ljobs")

    @cached_property
    def lresults(self) -> str:
        """HASH job id -> encoded result of a small job."""
        return self._k("lresults")

    @cached_property
    def lerrors(self) -> str:
        """HASH job id -> JSON error record of a dead-lettered small job."""
        return self._k("lerrors")

    @cached_property
    def lactive(self) -> str:
        """ZSET job id -> submit ms: the unfinished small jobs."""
        return self._k("lactive")

    @cached_property
    def ldone(self) -> str:
        """ZSET job id -> forget-after ms: finished small jobs kept for their retention
        whose forget-after time was below ``lkept``'s last id when they finished."""
        return self._k("ldone")

    @cached_property
    def lkept(self) -> str:
        """STREAM of finished small jobs kept for their retention: entry id the
        forget-after ms, fields ``r`` (the retention, ms) and ``j`` (job ids,
        space-separated); about 25 bytes a job (see includes/lane_complete.lua)."""
        return self._k("lkept")

    @cached_property
    def lstarts(self) -> str:
        """HASH lane entry id -> consumer: starts recorded before a suspect entry ran."""
        return self._k("lstarts")

    @cached_property
    def channel(self) -> str:
        """Pub/sub channel announcing every completion of the queue."""
        return self._k("done")

    def job(self, job_id: str) -> JobKeys:
        """The keys of job ``job_id`` of this queue (of any of its shards)."""
        return JobKeys(job_id, self.name)

    def job_channel(self, job_id: str) -> str:
        """Pub/sub channel announcing one job's completion."""
        return self._k(f"done:{job_id}")


@dataclass(frozen=True, slots=True)
class JobKeys:
    """Keys of one job; all share the job's cluster slot.

    Made for every job a worker serves, so its names are plain properties (built on
    access) rather than cached ones, whose first access costs more than the name.
    """

    job_id: str
    #: the job's queue (its name, never a shard's tag): job ids are per queue, so
    #: the job's hash tag is ``<queue>/<job>`` (a ``/`` is in no name)
    queue: str

    def __post_init__(self) -> None:
        check_name("job id", self.job_id)
        check_name("queue name", self.queue)

    @property
    def tag(self) -> str:
        """The job's hash tag: all its keys are ``sq:{<queue>/<job>}:<part>``."""
        return f"{self.queue}{JOB_SEP}{self.job_id}"

    @property
    def tasks(self) -> str:
        """STREAM of sub-requests, with the consumer group ``workers``."""
        return f"{PREFIX}:{{{self.queue}/{self.job_id}}}:tasks"

    @property
    def meta(self) -> str:
        """HASH of the job's settings, counters and state."""
        return f"{PREFIX}:{{{self.queue}/{self.job_id}}}:meta"

    @property
    def results(self) -> str:
        """HASH sub-request index -> encoded result."""
        return f"{PREFIX}:{{{self.queue}/{self.job_id}}}:results"

    @property
    def errors(self) -> str:
        """HASH sub-request index -> error text of a dead-lettered sub-request."""
        return f"{PREFIX}:{{{self.queue}/{self.job_id}}}:errors"

    @property
    def retry(self) -> str:
        """ZSET of sub-requests waiting for their next attempt (score: due time in ms).

        A member is ``<attempts made>|<index>|<type>|<payload bytes>``.
        """
        return f"{PREFIX}:{{{self.queue}/{self.job_id}}}:retry"

    @property
    def inflight(self) -> str:
        """HASH entry id -> consumer, for entries whose start was recorded before the handler ran."""
        return f"{PREFIX}:{{{self.queue}/{self.job_id}}}:inflight"

    @property
    def dlq(self) -> str:
        """HASH sub-request index -> type letter + payload of a dead-lettered sub-request."""
        return f"{PREFIX}:{{{self.queue}/{self.job_id}}}:dlq"

    @property
    def unannounced(self) -> str:
        """SET of dead-lettered indexes not yet copied to the queue's dead-letter stream."""
        return f"{PREFIX}:{{{self.queue}/{self.job_id}}}:unannounced"

    @property
    def batches(self) -> str:
        """HASH batch id -> index of its first sub-request, written by ``add_tasks`` so a
        resent add is recognised; expires the job's retention after its latest add."""
        return f"{PREFIX}:{{{self.queue}/{self.job_id}}}:batches"

    @property
    def added(self) -> str:
        """HASH deterministic sub-request id -> index, written by fenced keyed adds (Spark)."""
        return f"{PREFIX}:{{{self.queue}/{self.job_id}}}:added"

    @property
    def ids(self) -> str:
        """HASH sub-request index -> deterministic id, the reverse of :attr:`added`."""
        return f"{PREFIX}:{{{self.queue}/{self.job_id}}}:ids"
