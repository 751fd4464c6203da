"""The options of the ``streamq`` Spark data source, parsed and checked once on the
driver (:class:`SourceOptions`), below the reader, the writer and the sink that take
them. The table of options is in :mod:`streamq.spark.source`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.types import StructType

from streamq.base import config
from streamq.base.keys import check_client, check_name
from streamq.services.watchdog import MAX_TIMEOUT_S, timeout_ms

from ..errors import ConfigError

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
