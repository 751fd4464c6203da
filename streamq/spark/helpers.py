"""Helpers around the ``streamq`` data source: session, submit, wait, read."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import uuid
from collections.abc import Iterator, Mapping
from urllib.parse import urlsplit

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, MapType, StructType

from streamq.base import config
from streamq.base.models import JobStatus
from streamq.producer.client import Queue

from ..errors import ConfigError
from .source import FORMAT, StreamqDataSource

#: Settings a session from :func:`spark_session` gets unless ``conf`` says otherwise.
SESSION_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
}


#: The master URLs Spark accepts (its SparkMasterRegex, and the yarn and k8s cluster managers).
MASTER_FORMS = ("local, local[N], local[*], local[N,MAX_FAILURES], "
                "local-cluster[WORKERS,CORES,MEMORY_MB], spark://HOST:PORT[,HOST:PORT...], "
                "k8s://https://HOST:PORT, yarn")
_LOCAL = re.compile(r"local(?:\[(?:[1-9]\d*|\*)(?:\s*,\s*\d+)?\])?")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*[1-9]\d*\s*,\s*[1-9]\d*\s*,\s*[1-9]\d*\s*\]")
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")


def _api_server_ok(url: str) -> bool:
    """An http(s) URL with a host (and, if given, a port from 1 to 65535)."""
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when out of range or not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and port != 0


def check_master(master: str) -> str:
    """``master`` (stripped) if it is a master URL Spark accepts, else ConfigError naming
    the forms: a bad URL fails here, before a JVM starts, not inside Spark."""
    m = master.strip()
    if m == "yarn" or _LOCAL.fullmatch(m) or _LOCAL_CLUSTER.fullmatch(m):
        return m
    if m.startswith("spark://"):
        hosts = [_HOST_PORT.fullmatch(h) for h in m[len("spark://"):].split(",")]
        if all(h is not None and 0 < int(h[1]) < 65536 for h in hosts):
            return m
    elif m.startswith("k8s://"):
        api = m[len("k8s://"):]  # Spark: no scheme means https
        if _api_server_ok(api if "://" in api else f"https://{api}"):
            return m
    raise ConfigError(f"Spark master {master!r} is not a master URL; use {MASTER_FORMS}")


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


def activate(spark: SparkSession) -> SparkSession:
    """Make ``spark`` the calling thread's active session, as ``createDataFrame`` does.

    Spark keeps the active session per thread: in a thread other than the one
    that built the session, ``SparkSession.getActiveSession()`` is None, and a
    read or write then finds no data source registered with
    ``spark.dataSource.register`` (``DATA_SOURCE_NOT_FOUND``). Only a classic
    session is changed; a Spark Connect session is left as it is.
    """
    if isinstance(spark, SparkSession):  # the classic (JVM) session
        jvm = spark._jvm
        assert jvm is not None
        SparkSession._activeSession = spark
        SparkSession._get_j_spark_session_class(jvm).setActiveSession(spark._jsparkSession)
    return spark


def register(spark: SparkSession) -> None:
    """Register the ``streamq`` format with a session and make it the calling thread's
    active session (see :func:`activate`), so the helpers work from any thread."""
    activate(spark)
    spark.dataSource.register(StreamqDataSource)


def spark_session(master: str = "local[*]", app_name: str = "streamq", *,
                  conf: Mapping[str, str] | None = None, log_file: str | None = None,
                  log_level: str = "WARN") -> SparkSession:
    """A SparkSession with the ``streamq`` format registered (ConfigError for a
    ``master`` Spark does not accept, see :func:`check_master`).

    Spark's Python workers run ``PYSPARK_PYTHON``; unset, it is set to the
    interpreter running this (``sys.executable``), so workers on this host import
    the same streamq and pyspark. On a cluster whose hosts keep that Python
    elsewhere, set ``PYSPARK_PYTHON`` to its path there. For ``local-cluster[...]``
    with ``SPARK_HOME`` unset, ``SPARK_HOME`` is set to the pyspark package (its
    workers launch executors from there). With ``log_file``, the log of a JVM
    started here goes to that file instead of stderr.
    """
    master = check_master(master)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local-cluster") and not os.environ.get("SPARK_HOME"):
        import pyspark

        os.environ["SPARK_HOME"] = os.path.dirname(os.path.abspath(pyspark.__file__))
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
        q.scripts.expire_keyed(q.keys.job(job_id))
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
