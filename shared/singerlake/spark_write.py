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

from singerlake.metadata import blake2_hex, make_record
from singerlake.paths import StreamPaths, new_file_id, normalise_label
from singerlake.storage import Storage

CHUNK_BYTES = 8 << 20
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


def chunk_table(lines: list[bytes], times: list[int], chunk_bytes: int = CHUNK_BYTES):
    """An Arrow table of chunks of consecutive newline-terminated lines, in order.

    The lines are joined once; the chunks are zero-copy slices of that buffer.
    """
    import pyarrow as pa

    offsets, counts, starts, ends = [0], [], [], []
    begin, position, size = 0, 0, 0
    for index, line in enumerate(lines):
        size += len(line)
        if size >= chunk_bytes or index == len(lines) - 1:
            stop = index + 1
            position += size
            offsets.append(position)
            counts.append(stop - begin)
            starts.append(min(times[begin:stop]))
            ends.append(max(times[begin:stop]))
            begin, size = stop, 0
    data = pa.py_buffer(b"".join(lines))
    chunks = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(counts), [None, pa.array(offsets, pa.int64()).buffers()[1], data])
    return pa.table(
        {
            "seq": pa.array(range(len(counts)), pa.int64()),
            "data": chunks,
            "records": pa.array(counts, pa.int64()),
            "start": pa.array(starts, pa.int64()),
            "end": pa.array(ends, pa.int64()),
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
        file_id = new_file_id()
        key = job.paths.data_file(job.schema_hash, self.start, self.end, file_id)
        job.storage.write(key, data, if_none_match=True)
        return make_record(
            file_id=file_id,
            path=key,
            where=normalise_label(job.paths.tap_id),
            what=normalise_label(job.paths.stream),
            start=int(self.start),
            end=int(self.end),
            content_hash=blake2_hex(data),
            size=len(data),
            records=self.records,
            schema_hash=job.schema_hash,
            work_id=job.work_id,
        )


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
    lines = [b"{}\n"] * (2 * default_parallelism(spark))
    table = chunk_table(lines, [0] * len(lines), chunk_bytes=1)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2")
    spark.createDataFrame(table).mapInArrow(_warm_partition, RESULT_SCHEMA).collect()
