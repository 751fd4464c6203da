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

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from ..errors import ConfigError
from .options import FORMAT, SourceOptions, check_key_column

__all__ = ["FORMAT", "SourceOptions", "StreamqDataSource"]


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
