"""A streaming query from JSON files into the streamq sink, run as its own process by
tests/system/test_spark_sink.py (so that the test can SIGKILL it and start it again).

    python tests/spark_stream_query.py URL QUEUE INPUT_DIR CHECKPOINT [--stall] [--one-job NAME]

Reads two files (a partition each) per micro-batch with ``trigger(availableNow=True)``;
``--stall`` makes the second partition of the third micro-batch (batch id 2) stop for
good, while its first partition adds its rows, so the test can kill the query in the
middle of that batch. ``--one-job NAME``: every micro-batch adds to the one job NAME.
"""

from __future__ import annotations

import sys
import time

from pyspark.sql import functions as F

from streamq.spark.helpers import spark_session


def main() -> None:
    url, queue, src, checkpoint = sys.argv[1:5]
    stall = "--stall" in sys.argv
    spark = spark_session("local[2]", "streamq-sink-test", log_level="ERROR",
                          conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "200",
                                # (as conftest.SPARK_TEST_JVM: less CPU to start)
                                "spark.driver.extraJavaOptions":
                                    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
                                "spark.sql.files.maxPartitionBytes": "1m"})

    def pace(i: int) -> int:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if stall and ctx and ctx.getLocalProperty("streaming.sql.batchId") == "2":
            if i == 5_500:  # in file 5, the second file of batch 2
                time.sleep(3600)
        return i

    df = (spark.readStream.schema("id bigint, name string").option("maxFilesPerTrigger", 2)
          .json(src).select(F.udf(pace, "bigint", useArrow=False)("id").alias("id"), "name"))
    sink = (df.writeStream.format("streamq").option("queue", queue).option("redisUrl", url)
            .option("pipelineDepth", 1).option("checkpointLocation", checkpoint))
    if "--one-job" in sys.argv:
        name = sys.argv[sys.argv.index("--one-job") + 1]
        sink = sink.option("jobPerBatch", "false").option("job", name)
    sink.trigger(availableNow=True).start().awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
