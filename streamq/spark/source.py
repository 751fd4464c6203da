"""The ``streamq`` Spark data source (PySpark Python Data Source API).

Write (``df.write.format("streamq").mode("append")``): the DataFrame becomes
the sub-requests of one streaming job, added from the executors
(:mod:`streamq.spark.writer`). Read (``spark.read.format("streamq")``) and
read stream (``spark.readStream.format("streamq")``): a job's settled
sub-requests with :data:`~streamq.spark.reader.RESULT_SCHEMA`
(:mod:`streamq.spark.reader`).

Options (names are case-insensitive):

=================  =====  ==========================================================
option             used   meaning
=================  =====  ==========================================================
queue              all    queue name (required)
job                all    job id (required); a write opens it (a new job). The streaming
                          sink takes it as the prefix of its batch jobs' ids
                          (``<job>-<batch id>``; default: the query id)
redisUrl           all    ``redis://`` / ``rediss://`` URL (default: STREAMQ_REDIS_URL,
                          else ``redis://127.0.0.1:6379/0``)
rowsPerRequest     write  rows per sub-request: 1 sends each row as a JSON object,
                          N > 1 sends chunks as a JSON list of row objects (default 1)
priority           write  0..99, 0 most urgent (default 50)
concurrency        write  tokens: sub-requests of the job in flight at once (default 1)
maxDeliveries      write  attempts per sub-request before it is dead-lettered (default 5)
client             write  client name for fairness (default "default")
timeout            write  seconds each handler run on one sub-request may take; a run
                          past it is a failed attempt (default: none)
pipelineDepth      write  add calls (of up to 500 sub-requests or 128 KiB) per round trip
                          (default 8; a round of 512 KiB goes at once)
jobPerBatch        sink   true (default): a job per micro-batch; false: every micro-batch
                          adds to the one open job named by ``job`` (required then),
                          which the query never finalizes
keyColumn          write  a column whose values identify rows (unique); a row's id is its
                          key. Without it, a row's id comes from its content (see
                          :mod:`streamq.spark.rowids`)
indexesPerSplit    read   sub-request indexes per Spark partition (default 20000)
=================  =====  ==========================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .. import config
from ..errors import ConfigError
from ..keys import check_client, check_name
from ..watchdog import MAX_TIMEOUT_S, timeout_ms

#: Redis URL when neither the ``redisUrl`` option nor STREAMQ_REDIS_URL is given.
DEFAULT_URL = "redis://127.0.0.1:6379/0"
#: Format name of the data source.
FORMAT = "streamq"


def _timeout(options: Mapping[str, str]) -> float | None:
    """The ``timeout`` option (seconds, see :mod:`streamq.watchdog`), checked."""
    raw = options.get("timeout")
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
        timeout_ms(value)
    except (ValueError, ConfigError):
        raise ConfigError(f"streamq data source: option 'timeout' must be a positive number "
                          f"of seconds up to {MAX_TIMEOUT_S}, got {raw!r}") from None
    return value


def _int(options: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    raw = options.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"streamq data source: option {name!r} must be an integer, "
                          f"got {raw!r}") from None
    if not lo <= value <= hi:
        raise ConfigError(f"streamq data source: option {name!r} must be from {lo} to {hi}, "
                          f"got {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (options.get(name) or "").strip().lower()
    if raw == "":
        return default
    if raw not in ("true", "false"):
        raise ConfigError(f"streamq data source: option {name!r} must be true or false, "
                          f"got {options.get(name)!r}")
    return raw == "true"


def _required(options: Mapping[str, str], name: str, kind: str) -> str:
    value = options.get(name)
    if not value:
        raise ConfigError(f"streamq data source: option {name!r} is required "
                          f"(.option({name!r}, ...))")
    return check_name(kind, value)


@dataclass(frozen=True)
class SourceOptions:
    """The options of one read or write, validated."""

    queue: str
    job: str
    redis_url: str
    rows_per_request: int = 1
    priority: int = config.DEFAULT_PRIORITY
    concurrency: int = config.DEFAULT_CONCURRENCY
    max_deliveries: int = config.DEFAULT_MAX_DELIVERIES
    client: str = config.DEFAULT_CLIENT
    pipeline_depth: int = 8
    indexes_per_split: int = 20_000
    key_column: str | None = None
    job_per_batch: bool = True
    #: each handler run's limit on one sub-request, seconds (``timeout``; None: none)
    timeout_s: float | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, job_required: bool = True) -> SourceOptions:
        """Validate Spark's (case-insensitive) options; raise ConfigError naming the option.
        The streaming sink takes ``job`` as an optional prefix of its batch jobs' ids."""
        url = options.get("redisUrl") or os.environ.get("STREAMQ_REDIS_URL") or DEFAULT_URL
        job = (_required(options, "job", "job id") if job_required or options.get("job")
               else "")
        return cls(
            queue=_required(options, "queue", "queue name"),
            job=job,
            redis_url=url,
            rows_per_request=_int(options, "rowsPerRequest", 1, 1, 1_000_000),
            priority=_int(options, "priority", config.DEFAULT_PRIORITY, 0, config.MAX_PRIORITY),
            concurrency=_int(options, "concurrency", config.DEFAULT_CONCURRENCY, 1,
                             config.MAX_CONCURRENCY),
            max_deliveries=_int(options, "maxDeliveries", config.DEFAULT_MAX_DELIVERIES, 1, 1000),
            client=check_client(options.get("client") or config.DEFAULT_CLIENT),
            pipeline_depth=_int(options, "pipelineDepth", 8, 1, 1000),
            indexes_per_split=_int(options, "indexesPerSplit", 20_000, 1, 10_000_000),
            key_column=options.get("keyColumn") or None,
            job_per_batch=_bool(options, "jobPerBatch", True),
            timeout_s=_timeout(options),
        )


def check_key_column(opts: SourceOptions, schema: StructType) -> None:
    """ConfigError when the keyColumn option names no column of the written schema."""
    if opts.key_column is not None and opts.key_column not in schema.fieldNames():
        raise ConfigError(f"streamq data source: keyColumn {opts.key_column!r} is not a column "
                          f"of the DataFrame (columns: {', '.join(schema.fieldNames())})")


class StreamqDataSource(DataSource):
    """``format("streamq")``: DataFrames in as one job's sub-requests, results out."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        from .reader import RESULT_SCHEMA

        return RESULT_SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ConfigError("streamq data source: only mode('append') is supported "
                              "(a write adds sub-requests to a job; nothing is overwritten)")
        from .writer import StreamqWriter

        opts = SourceOptions.parse(self.options)
        check_key_column(opts, schema)
        return StreamqWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise ConfigError("streamq data source: only outputMode('append') is supported")
        from .sink import StreamqStreamWriter

        opts = SourceOptions.parse(self.options, job_required=False)
        if not opts.job_per_batch and not opts.job:
            raise ConfigError("streamq sink: option 'job' is required with jobPerBatch false "
                              "(it names the one job every micro-batch adds to)")
        check_key_column(opts, schema)
        return StreamqStreamWriter(opts)

    def reader(self, schema: StructType) -> DataSourceReader:
        from .reader import StreamqReader

        return StreamqReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .reader import StreamqStreamReader

        return StreamqStreamReader(SourceOptions.parse(self.options))
