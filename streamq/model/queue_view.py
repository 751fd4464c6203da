"""What the parts of a queue client need of it, as narrow protocols.

:class:`streamq.client.Queue` is assembled from parts (flow control, cancel, rate
limits, the small-job lane, job handles). Each part is typed against the few
attributes it uses, declared here, not against ``Queue``: a part cannot reach the
rest of the client, and nothing below the client imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from streamq.model.lane_scripts import QueueSettings

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from streamq.base.keys import QueueKeys
    from streamq.base.models import JobStatus
    from streamq.base.replies import Call, JobReply
    from streamq.model.scripts import Scripts
    from streamq.storage.connection import Client


class Served(Protocol):
    """A client or process bound to a queue: its connection, its scripts, and the keys of
    its first shard."""

    @property
    def redis(self) -> Client: ...
    @property
    def scripts(self) -> Scripts: ...
    @property
    def keys(self) -> QueueKeys: ...


class Serving(Served, Protocol):
    """A worker as its parts know it: :class:`Served`, with its id."""

    @property
    def id(self) -> str: ...


class QueueFinisher(QueueSettings, Protocol):
    """What a worker's slots need of its queue client: the calls that finish terminal
    jobs in the queue's hash slot."""

    def finish_call(self, jid: str, reply: JobReply, qk: QueueKeys | None = None) -> Call: ...

    def finish_many_call(self, jobs: Sequence[tuple[str, JobReply]],
                         qk: QueueKeys | None = None) -> Call: ...


class QueueStore(QueueSettings, Served, Protocol):
    """A queue's server: its connection, its scripts and its shards."""

    @property
    def shards(self) -> list[QueueKeys]: ...
    @property
    def known_shards(self) -> list[QueueKeys]: ...

    def shard_of(self, tag: str) -> QueueKeys: ...

    def lane_shard(self, job_id: str) -> QueueKeys: ...


class QueueJobs(QueueStore, Protocol):
    """What a job handle, a cancel and a re-prioritize need besides the store: read a
    job's state and results, wait for it, and finish it in the queue's hash slot."""

    def status(self, job_id: str) -> JobStatus: ...

    def results(self, job_id: str) -> dict[int, Any]: ...

    def wait(self, job_id: str, timeout: float | None = None) -> JobStatus: ...

    def finish_call(self, jid: str, reply: JobReply, qk: QueueKeys | None = None) -> Call: ...

    def register(self, jobs: Sequence[tuple[str, JobReply]], qk: QueueKeys | None = None
                 ) -> None: ...

    def _finish(self, jid: str, reply: JobReply, qk: QueueKeys | None = None) -> bool: ...

    def _encode_all(self, payloads: Iterable[Any]) -> list[tuple[bytes, bytes]]: ...
