"""Packaging of the Spark side: the ``spark`` extra, the helpers from any thread, Arrow
paths that need pandas, and ``pipeline run --master`` (validation, ``local-cluster``,
the executors' interpreter and ``--conf``) against a real redis-server."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tomllib
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import redis
from conftest import SPARK_TEST_JVM
from packaging.requirements import Requirement
from packaging.version import Version
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamq import JobState, Worker
from streamq.base.keys import QueueKeys
from streamq.errors import ConfigError
from streamq.spark.helpers import (
    check_master,
    read_results,
    spark_session,
    submit_dataframe,
    wait_job,
)

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
StartWorker = Callable[..., Worker]


def java_or_skip() -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java: no `java` on PATH and JAVA_HOME unset")


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    # the same session as tests/system/test_spark.py's (one SparkContext per process: the second
    # fixture to run gets the first one's session)
    java_or_skip()
    log = tmp_path_factory.mktemp("spark") / "spark.log"
    session = spark_session("local[2,2]", "streamq-tests", log_file=str(log), log_level="ERROR",
                            conf={"spark.sql.shuffle.partitions": "4", **SPARK_TEST_JVM})
    yield session
    session.stop()


# -- the spark extra -----------------------------------------------------------------------


def spark_extra() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["optional-dependencies"]["spark"]]
    return {r.name.lower(): r for r in reqs}


def lower_bound(req: Requirement) -> Version | None:
    found = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    return max(found) if found else None


def test_spark_extra_holds_what_pysparks_arrow_paths_need() -> None:
    # Given the spark extra and the requirements of pyspark's own "sql" extra (its Arrow
    # conversions and pandas UDFs) as the installed pyspark declares them
    extra = spark_extra()
    sql = [Requirement(r) for r in metadata.requires("pyspark") or []
           if Requirement(r).marker is not None
           and Requirement(r).marker.evaluate({"extra": "sql"})]
    assert {r.name for r in sql} >= {"pandas", "pyarrow"}
    # Then the extra names each of them, with a lower bound no lower than pyspark's
    for need in sql:
        have = extra.get(need.name.lower())
        assert have is not None, f"the spark extra lacks {need}"
        theirs, ours = lower_bound(need), lower_bound(have)
        assert theirs is None or (ours is not None and ours >= theirs), (need, have)
    # and pyspark from 4.1 (DataSourceStreamArrowWriter), and what is installed satisfies it
    assert lower_bound(extra["pyspark"]) == Version("4.1")
    for name, req in extra.items():
        assert req.specifier.contains(metadata.version(name), prereleases=True), name


def test_installed_pandas_passes_pysparks_check_without_warning() -> None:
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pandas 3 draws a FutureWarning here
        require_minimum_pandas_version()


# -- Arrow paths that need pandas, on a job's results --------------------------------------


def test_pandas_arrow_paths_on_a_jobs_results(
        spark: SparkSession, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    # Given a DataFrame built from pandas, through Arrow, written as a job workers process
    workers(queue_name, lambda p: {"n": p["n"], "sq": p["n"] * p["n"]}, concurrency=4)
    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    spark.conf.set("spark.sql.execution.arrow.pyspark.fallback.enabled", "false")
    try:
        src = spark.createDataFrame(pd.DataFrame({"n": range(500)})).repartition(2)
        job = submit_dataframe(src, queue_name, redis_url, concurrency=8)
        assert wait_job(queue_name, job, redis_url, timeout=60).state is JobState.SUCCEEDED
        res = read_results(spark, queue_name, job, redis_url,
                           result_schema="struct<n:bigint,sq:bigint>")

        @F.pandas_udf("bigint")
        def minus_n(sq: pd.Series, n: pd.Series) -> pd.Series:
            return sq - n

        def even_only(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            for b in batches:
                yield b[b["n"] % 2 == 0]

        # When the results go through a pandas UDF, mapInPandas and toPandas (all Arrow)
        flat = res.select("status", "result.n", "result.sq")
        got = (flat.withColumn("d", minus_n("sq", "n"))
               .mapInPandas(even_only, "status string, n bigint, sq bigint, d bigint")
               .toPandas().sort_values("n"))
    finally:
        spark.conf.unset("spark.sql.execution.arrow.pyspark.enabled")
        spark.conf.unset("spark.sql.execution.arrow.pyspark.fallback.enabled")
    # Then every even row is there once, with the handler's result
    assert got["status"].tolist() == ["done"] * 250
    assert got["n"].tolist() == list(range(0, 500, 2))
    assert got["sq"].tolist() == [n * n for n in range(0, 500, 2)]
    assert got["d"].tolist() == [n * n - n for n in range(0, 500, 2)]


# -- the helpers from any thread -----------------------------------------------------------


def test_helpers_work_from_two_threads_at_once(
        spark: SparkSession, redis_url: str, queue_name: str, workers: StartWorker) -> None:
    # Given workers, and two threads that did not build the session (no active session there)
    workers(queue_name, lambda p: p["id"] * 3, concurrency=4)
    sizes = {"a": 300, "b": 450}

    def submit_and_read(name: str) -> tuple[str | None, JobState, list[int]]:
        before = SparkSession.getActiveSession()
        df = spark.range(0, sizes[name], numPartitions=2)
        job = submit_dataframe(df, queue_name, redis_url, job_id=f"thread-{name}")
        st = wait_job(queue_name, job, redis_url, timeout=60)
        rows = read_results(spark, queue_name, job, redis_url).collect()
        return (None if before is None else "set"), st.state, sorted(json.loads(r.result)
                                                                     for r in rows)

    # When each submits a DataFrame and reads its results, both at the same time
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(submit_and_read, name) for name in sizes}
        got = {name: f.result(timeout=120) for name, f in futures.items()}
    # Then each got its own job's results, all of them
    for name, n in sizes.items():
        before, state, results = got[name]
        assert before is None  # the threads really started without an active session
        assert state is JobState.SUCCEEDED
        assert results == [i * 3 for i in range(n)]


# -- pipeline run --master -----------------------------------------------------------------


@pytest.mark.parametrize("master", ["local", "local[*]", "local[4]", "local[2,3]",
                                    "local-cluster[2,1,1024]", "spark://10.0.0.5:7077",
                                    "spark://m1:7077,m2:7077", "spark://[::1]:7077",
                                    "k8s://https://10.0.0.1:6443", "k8s://api.k8s.internal:443",
                                    "k8s://https://kubernetes.default.svc",
                                    "yarn"])
def test_master_urls_spark_accepts_pass(master: str) -> None:
    assert check_master(f" {master} ") == master


@pytest.mark.parametrize("master", ["", "foo", "local[0]", "local[x]", "local-cluster[2,1]",
                                    "local-cluster[0,1,1024]", "spark://host", "spark://h:0",
                                    "spark://h:70000", "spark://h:7077,", "k8s://",
                                    "k8s://https://h:0", "k8s://ftp://h:21",
                                    "mesos://h:5050"])
def test_master_urls_spark_refuses_are_config_errors(master: str) -> None:
    with pytest.raises(ConfigError, match="is not a master URL; use local"):
        check_master(master)


def streamq_pipeline(*args: str, url: str,
                     env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, STREAMQ_REDIS_URL=url, PYTHONPATH=str(ROOT))
    full.pop("SPARK_HOME", None)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "streamq", "pipeline", "run", *args],
                          env=full, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("master", ["spark://host-without-port", "local[0]", "mesos://h:5050"])
def test_pipeline_bad_master_is_one_line_and_exit_2(tmp_path: Path, redis_url: str,
                                                   master: str) -> None:
    src = tmp_path / "in.csv"
    src.write_text("id\n1\n")
    res = streamq_pipeline("--input", str(src), "--output", str(tmp_path / "o.jsonl"),
                           "--queue", "q", "--handler", "streamq.spark.demo:handle",
                           "--master", master, url=redis_url)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"streamq: Spark master {master!r} is not a master URL; use local, local[N], local[*], "
        "local[N,MAX_FAILURES], local-cluster[WORKERS,CORES,MEMORY_MB], "
        "spark://HOST:PORT[,HOST:PORT...], k8s://https://HOST:PORT, yarn"]
    assert not (tmp_path / "o.jsonl").exists()


def test_pipeline_bad_conf_is_one_line_and_exit_2(tmp_path: Path, redis_url: str) -> None:
    src = tmp_path / "in.csv"
    src.write_text("id\n1\n")
    res = streamq_pipeline("--input", str(src), "--output", str(tmp_path / "o.jsonl"),
                           "--queue", "q", "--handler", "streamq.spark.demo:handle",
                           "--conf", "spark.executor.memory", url=redis_url)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "streamq: --conf 'spark.executor.memory' is not KEY=VALUE"]


def test_py4j_error_becomes_the_java_exception_line() -> None:
    from streamq.spark.cli import spark_error_message

    text = ("An error occurred while calling None.org.apache.spark.api.java.JavaSparkContext.\n"
            ": org.apache.spark.SparkException: Asked to launch cluster with 1 MiB/worker but "
            "requested 1024 MiB/executor\n\tat org.apache.spark.SparkContext$.createTaskScheduler"
            "(SparkContext.scala:3366)\n")
    assert spark_error_message(RuntimeError(text)) == (
        "SparkException: Asked to launch cluster with 1 MiB/worker but requested 1024 MiB/executor")


def test_pipeline_spark_not_starting_names_the_master_and_the_reason(
        tmp_path: Path, redis_url: str) -> None:
    java_or_skip()
    # Given a master Spark refuses at start (workers of 1 MiB, executors of 1 GiB)
    src, log = tmp_path / "in.csv", tmp_path / "spark.log"
    src.write_text("id\n1\n")
    res = streamq_pipeline("--input", str(src), "--output", str(tmp_path / "o.jsonl"),
                           "--queue", "q", "--handler", "streamq.spark.demo:handle",
                           "--master", "local-cluster[1,1,1]", "--spark-log", str(log),
                           url=redis_url)
    # Then one line says so, with Spark's reason and its log
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines() == [
        "streamq: Spark did not start with master 'local-cluster[1,1,1]': SparkException: "
        "Asked to launch cluster with 1 MiB/worker but requested 1024 MiB/executor "
        f"(Spark log: {log})"]


def test_pipeline_on_local_cluster_runs_executors_python_from_pysparks_python(
        tmp_path: Path, r: redis.Redis, redis_url: str, queue_name: str) -> None:
    java_or_skip()
    # Given a CSV of 200 rows, SPARK_HOME unset, and PYSPARK_PYTHON pointing at a wrapper
    # of this interpreter that notes the STREAMQ_TEST_MARK its environment holds
    src, out, marks = tmp_path / "rows.csv", tmp_path / "results.jsonl", tmp_path / "marks"
    lines = ["id,name,price_cents,qty,category"]
    lines += [f"{i},item-{i},{i % 89 + 1},{i % 4 + 1},games" for i in range(200)]
    src.write_text("\n".join(lines) + "\n")
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\necho "mark=${{STREAMQ_TEST_MARK:-}}" >> {marks}\n'
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    # When the pipeline runs on two executor JVMs, with a Spark setting that gives the
    # executors' environment the mark
    res = streamq_pipeline("--input", str(src), "--output", str(out), "--queue", queue_name,
                           "--handler", "streamq.spark.demo:handle", "--chunk-rows", "10",
                           "--workers", "1", "--master", "local-cluster[2,1,1024]",
                           "--conf", "spark.executorEnv.STREAMQ_TEST_MARK=on-executor",
                           "--spark-log", str(tmp_path / "spark.log"), "--json",
                           url=redis_url, env={"PYSPARK_PYTHON": str(wrapper)})
    # Then it succeeds, and the output holds the handler's result for every row
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert (summary["state"], summary["rows"], summary["sub_requests"],
            summary["failed"]) == ("succeeded", 200, 20, 0)
    from streamq.spark.demo import transform

    got: dict[int, Any] = {}
    for f in sorted(out.glob("*.json")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            assert rec["status"] == "done"
            for item in json.loads(rec["result"]):
                assert item["id"] not in got
                got[item["id"]] = item
    assert got == {i: transform({"id": i, "name": f"item-{i}", "price_cents": i % 89 + 1,
                                 "qty": i % 4 + 1, "category": "games"}) for i in range(200)}
    # and the executors' Python workers ran PYSPARK_PYTHON, with the --conf environment
    assert "mark=on-executor" in marks.read_text().splitlines()
    assert r.zcard(QueueKeys(queue_name).workers) == 0  # its worker stopped cleanly
