"""Writing a batch of one stream-schema as a Spark DataFrame; data files are written on executors.

The DataFrame's rows are *chunks*: runs of consecutive raw Singer lines (about 1 MiB each) with
their record count and time range. Few large rows keep Spark's per-row cost out of the way while
the records themselves still travel through Spark to the executors, which gzip them and write
the data files (create-only). Only the files' metadata records come back to the driver, which
commits them (SPEC.md §9). Nothing becomes visible if any task fails.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from singerlake.paths import StreamPaths
from singerlake.singer_file import store
from singerlake.storage import Storage

CHUNK_BYTES = 1 << 20
RESULT_SCHEMA = "first_chunk long, meta string"


@dataclass(frozen=True)
class FileJob:
    """Everything an executor needs to write one stream-schema's files (pickled into the task)."""

    storage: Storage
    paths: StreamPaths
    schema_hash: str
    schema_line: bytes
    max_file_bytes: int
    compresslevel: int
    work_id: str | None


@dataclass
class Chunk:
    """Consecutive newline-terminated lines, their count and time range."""

    data: bytes | bytearray
    records: int
    start: int
    end: int


def chunk_table(chunks: list[Chunk]):
    """The Arrow table a segment's DataFrame is made from: one row per chunk, in order."""
    import pyarrow as pa

    offsets = [0]
    for chunk in chunks:
        offsets.append(offsets[-1] + len(chunk.data))
    joined = pa.py_buffer(b"".join(chunk.data for chunk in chunks))  # the one copy of the batch
    data = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(chunks), [None, pa.array(offsets, pa.int64()).buffers()[1], joined])
    return pa.table(
        {
            "seq": pa.array(range(len(chunks)), pa.int64()),
            "data": data,
            "records": pa.array([c.records for c in chunks], pa.int64()),
            "start": pa.array([c.start for c in chunks], pa.int64()),
            "end": pa.array([c.end for c in chunks], pa.int64()),
        }
    )


class _FileBuilder:
    def __init__(self, job: FileJob, first_chunk: int):
        self.job = job
        self.first_chunk = first_chunk
        self.compressor = zlib.compressobj(job.compresslevel, zlib.DEFLATED, 31)  # gzip, mtime 0
        self.parts = [self.compressor.compress(job.schema_line)]
        self.raw_bytes = 0
        self.records = 0
        self.start, self.end = math.inf, -math.inf

    def add(self, data: bytes, records: int, start: int, end: int) -> None:
        self.parts.append(self.compressor.compress(data))
        self.raw_bytes += len(data)
        self.records += records
        self.start, self.end = min(self.start, start), max(self.end, end)

    def finish(self) -> dict[str, Any]:
        job = self.job
        self.parts.append(self.compressor.flush())
        data = b"".join(self.parts)
        return store(job.storage, job.paths, job.schema_hash, data, int(self.start), int(self.end), self.records, job.work_id)


def _chunks(batch) -> Iterator[tuple[int, memoryview, int, int, int]]:
    """Rows of a chunk batch, with the data as zero-copy views of the Arrow buffer."""
    import pyarrow as pa

    data = batch.column("data")
    width = "q" if pa.types.is_large_binary(data.type) else "i"  # Spark may send binary or large_binary
    offsets = memoryview(data.buffers()[1]).cast(width)[data.offset : data.offset + len(data) + 1]
    payload = memoryview(data.buffers()[2])
    rows = zip(
        batch.column("seq").to_pylist(),
        batch.column("records").to_pylist(),
        batch.column("start").to_pylist(),
        batch.column("end").to_pylist(),
        strict=True,
    )
    for index, (seq, records, start, end) in enumerate(rows):
        yield seq, payload[offsets[index] : offsets[index + 1]], records, start, end


def write_partition(job: FileJob, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body: chunks in, one row of metadata per data file written out."""
    import pyarrow as pa

    firsts, metas = [], []
    builder = None
    for batch in batches:
        for seq, data, records, start, end in _chunks(batch):
            if builder is None:
                builder = _FileBuilder(job, seq)
            builder.add(data, records, start, end)
            if builder.raw_bytes >= job.max_file_bytes:
                firsts.append(builder.first_chunk)
                metas.append(json.dumps(builder.finish()))
                builder = None
    if builder is not None:
        firsts.append(builder.first_chunk)
        metas.append(json.dumps(builder.finish()))
    yield pa.RecordBatch.from_pydict({"first_chunk": pa.array(firsts, pa.int64()), "meta": pa.array(metas, pa.string())})


def default_parallelism(spark) -> int:
    try:
        return max(1, spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext; its conf may still say
        return max(1, int(spark.conf.get("spark.default.parallelism", "2")))


def write_with_spark(spark, job: FileJob, table) -> list[dict[str, Any]]:
    """Run one Spark job writing a ``chunk_table`` as data files; returns their records in record order."""
    parallelism = default_parallelism(spark)
    # Spark cuts a local Arrow table into partitions of this many rows: spread chunks over the cores.
    per_partition = max(1, math.ceil(table.num_rows / parallelism))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(per_partition))
    frame = spark.createDataFrame(table)
    rows = frame.mapInArrow(lambda batches: write_partition(job, batches), RESULT_SCHEMA).collect()
    return [json.loads(row["meta"]) for row in sorted(rows, key=lambda row: row["first_chunk"])]


def _warm_partition(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    import singerlake.spark_write  # noqa: F401  (the import is the point: workers start warm)

    yield pa.RecordBatch.from_pydict({"first_chunk": [sum(b.num_rows for b in batches)], "meta": [""]})


def warm_up(spark) -> None:
    """Start the Python workers and load their imports while the first batch is still being read."""
    table = chunk_table([Chunk(b"{}\n", 1, 0, 0)] * (2 * default_parallelism(spark)))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2")
    spark.createDataFrame(table).mapInArrow(_warm_partition, RESULT_SCHEMA).collect()
