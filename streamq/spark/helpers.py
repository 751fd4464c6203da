"""Helpers around the ``streamq`` data source: session, submit, wait, read."""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator, Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StructType

from .. import config
from ..client import Queue
from ..keys import JobKeys
from ..models import JobStatus
from .source import FORMAT, StreamqDataSource

#: Settings a session from :func:`spark_session` gets unless ``conf`` says otherwise.
SESSION_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
}


@contextlib.contextmanager
def _stderr_to(path: str | None) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` while the block runs (the JVM started in it,
    and every Python worker it starts, keeps writing its log there)."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = os.dup(2)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def register(spark: SparkSession) -> None:
    """Register the ``streamq`` format with a session."""
    spark.dataSource.register(StreamqDataSource)


def spark_session(master: str = "local[*]", app_name: str = "streamq", *,
                  conf: Mapping[str, str] | None = None, log_file: str | None = None,
                  log_level: str = "WARN") -> SparkSession:
    """A SparkSession with the ``streamq`` format registered.

    Spark's Python workers run the interpreter running this (``PYSPARK_PYTHON``
    and ``PYSPARK_DRIVER_PYTHON`` are set to ``sys.executable``), so they import
    the same streamq and pyspark. With ``log_file``, the log of a JVM started
    here goes to that file instead of stderr.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**SESSION_DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, value)
    with _stderr_to(log_file):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark


def submit_dataframe(df: DataFrame, queue: str, redis_url: str, *, job_id: str | None = None,
                     rows_per_request: int = 1, priority: int = config.DEFAULT_PRIORITY,
                     concurrency: int = 8, max_deliveries: int = config.DEFAULT_MAX_DELIVERIES,
                     client: str = config.DEFAULT_CLIENT, pipeline_depth: int = 8,
                     key_column: str | None = None) -> str:
    """Write ``df`` as the sub-requests of one new job (its id generated when not
    given); return the job id once every row is added and the job finalized.
    ``key_column`` names a column of unique values that identify the rows."""
    jid = job_id or uuid.uuid4().hex
    register(df.sparkSession)
    writer = (df.write.format(FORMAT).mode("append")
              .option("queue", queue).option("job", jid).option("redisUrl", redis_url)
              .option("rowsPerRequest", rows_per_request).option("priority", priority)
              .option("concurrency", concurrency).option("maxDeliveries", max_deliveries)
              .option("client", client).option("pipelineDepth", pipeline_depth))
    if key_column is not None:
        writer = writer.option("keyColumn", key_column)
    writer.save()
    return jid


def wait_job(queue: str, job_id: str, redis_url: str,
             timeout: float | None = None) -> JobStatus:
    """Block until the job is terminal (WaitTimeout after ``timeout`` s); return its status."""
    q = Queue(queue, redis_url)
    try:
        status = q.wait(job_id, timeout)
        q.scripts.expire_keyed(JobKeys(job_id))
        return status
    finally:
        q.close()


def read_results(spark: SparkSession, queue: str, job_id: str, redis_url: str, *,
                 result_schema: ArrayType | MapType | StructType | str | None = None,
                 indexes_per_split: int | None = None) -> DataFrame:
    """The job's settled sub-requests (see :data:`streamq.spark.reader.RESULT_SCHEMA`);
    with ``result_schema`` the ``result`` column is parsed from JSON into that type."""
    register(spark)
    reader = (spark.read.format(FORMAT).option("queue", queue).option("job", job_id)
              .option("redisUrl", redis_url))
    if indexes_per_split is not None:
        reader = reader.option("indexesPerSplit", indexes_per_split)
    df = reader.load()
    if result_schema is not None:
        df = df.withColumn("result", F.from_json(F.col("result"), result_schema))
    return df
