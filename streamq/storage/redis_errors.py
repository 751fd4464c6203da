"""Which Redis errors are waited out and which stop a process.

Transient errors (Redis unreachable, busy, loading, read-only after a failover,
a cluster settling) are waited out with backoff by every streamq process;
access errors (refused credentials, NOPERM) stop it with one line. Nothing
else is either: it is raised as it is.
"""

from __future__ import annotations

import redis
from redis.exceptions import RedisClusterException

from streamq.errors import ConnectionFailed

#: Errors that mean "Redis is unreachable right now" (as opposed to a bad command).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    ConnectionError,
    OSError,
)


#: Errors that retrying cannot fix: wrong credentials, a command the ACL user may not run.
ACCESS_ERRORS: tuple[type[BaseException], ...] = (
    redis.AuthenticationError,
    redis.exceptions.NoPermissionError,
    redis.exceptions.AuthenticationWrongNumberOfArgsError,
)


#: First word of an error reply that means "Redis cannot serve this right now, but
#: will": out of memory, a long script, loading its data set, a read-only replica
#: after a failover, a failed background save, a cluster slot in migration or a
#: cluster without a quorum, a blocking command cut short because the server turned
#: into a replica (UNBLOCKED). Waited out with backoff, never fatal.
TRANSIENT_REPLIES: frozenset[str] = frozenset({
    "OOM", "BUSY", "LOADING", "READONLY", "MISCONF", "TRYAGAIN", "CLUSTERDOWN",
    "MASTERDOWN", "NOREPLICAS", "NOTBUSY", "UNBLOCKED",
})


def reply_text(error: BaseException) -> str:
    """The error reply Redis gave: redis-py's pipelines put "Command # n (...) of
    pipeline caused error: " before it."""
    return str(error).rpartition(" of pipeline caused error: ")[2]


def is_transient(error: BaseException) -> bool:
    """True when ``error`` is one to wait out: Redis unreachable or busy for a while.

    Access errors (refused credentials, NOPERM) are never transient.
    """
    if isinstance(error, ACCESS_ERRORS) or _refused_underneath(error):
        return False
    if isinstance(error, ConnectionFailed):
        # (a Queue's call refused by a transient reply for longer than it waited)
        return error.transient
    if isinstance(error, CONNECTION_ERRORS):
        return True
    if isinstance(error, (RedisClusterException, redis.exceptions.ClusterError,
                          redis.exceptions.MovedError, redis.exceptions.AskError)):
        # a cluster whose slot map cannot be read or rebuilt (no node answers, a slot
        # not served), or redirections still going on when a batch's retries ran out
        # (a failover, a slot in migration): the cluster will settle
        return True
    if isinstance(error, redis.ResponseError):
        word = reply_text(error).split(" ", 1)[0].upper()
        if word in TRANSIENT_REPLIES:
            return True
        # redis-py strips the error word of the replies it maps to its own classes
        return isinstance(error, (redis.exceptions.BusyLoadingError,
                                  redis.exceptions.ReadOnlyError,
                                  getattr(redis.exceptions, "OutOfMemoryError", ()),
                                  getattr(redis.exceptions, "TryAgainError", ()),
                                  getattr(redis.exceptions, "ClusterDownError", ()),
                                  getattr(redis.exceptions, "MasterDownError", ())))
    return False


def _refused_underneath(error: BaseException) -> bool:
    """True when ``error`` was caused by refused access (redis-py words a NOPERM on
    ``CLUSTER SLOTS`` as "Cluster mode is not enabled", with the NOPERM as its cause)."""
    seen = 0
    cause = error.__cause__ or error.__context__
    while cause is not None and seen < 10:
        if isinstance(cause, ACCESS_ERRORS) or "NOPERM" in str(cause):
            return True
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return False


def is_access_error(error: BaseException) -> bool:
    """True when ``error`` means Redis refused this client: wrong credentials or a
    command its ACL user may not run. Retrying cannot fix it."""
    if isinstance(error, ACCESS_ERRORS) or _refused_underneath(error):
        return True
    return isinstance(error, redis.ResponseError) and str(error).startswith(
        ("NOPERM", "WRONGPASS", "NOAUTH", _SCRIPT_NOPERM))


#: How Redis 7.0 words NOPERM for a command a script runs.
_SCRIPT_NOPERM = "The user executing the script can't run this command"
