"""Spark integration: the ``streamq`` data source, helpers, the pipeline and its demo.

A DataFrame becomes one job (rows, or chunks of rows, as sub-requests added
from the executors); a job's results become a DataFrame::

    from streamq.spark import spark_session, submit_dataframe, wait_job, read_results

    spark = spark_session("local[*]")            # registers the "streamq" format
    job_id = submit_dataframe(df, "etl", url, rows_per_request=100)
    wait_job("etl", job_id, url)
    results = read_results(spark, "etl", job_id, url, result_schema="array<string>")

Importing this package does not import pyspark (the ``streamq`` command line
imports :mod:`streamq.spark.cli` at start); the names below load on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RESULT_SCHEMA", "StreamqDataSource", "abort_job", "finalize_job", "read_results",
           "register",
           "spark_session", "submit_dataframe", "wait_job"]

_WHERE = {
    "RESULT_SCHEMA": "streamq.spark.reader",
    "StreamqDataSource": "streamq.spark.source",
    "abort_job": "streamq.spark.writer",
    "finalize_job": "streamq.spark.writer",
    "read_results": "streamq.spark.helpers",
    "register": "streamq.spark.helpers",
    "spark_session": "streamq.spark.helpers",
    "submit_dataframe": "streamq.spark.helpers",
    "wait_job": "streamq.spark.helpers",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'streamq.spark' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
