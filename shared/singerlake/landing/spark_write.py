"""Writing a batch as one Spark DataFrame job; data files are written on executors.

The DataFrame's rows are *chunks*: runs of consecutive raw Singer lines (about 1 MiB each), each
already gzipped as one gzip member, with their record count and time range, tagged with the
*segment* (stream-schema run of records, SPEC.md §10) they belong to. All segments of a batch,
whatever the number of streams, travel in one DataFrame, so a batch costs one Spark job. The
driver gzips each chunk in a thread pool while it goes on reading, so the bytes that cross Spark
(and, on a cluster, the network) are about a ninth of the text, and few large rows keep Spark's
per-row cost out of the way. Executors join the members of a file behind its segment's SCHEMA
member (a series of members is one gzip file, RFC 1952 §2.2), hash it and write it (create-only),
several files at once. Only the files' metadata records come back to the driver, each with the
file's column statistics (what its values need, ``format/needs.py``, found from the members the
executor holds), and the driver commits them (SPEC.md §9). Nothing becomes visible if any task fails.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from singerlake.format.datafile import gzip_member, store
from singerlake.format.layout import StreamPaths
from singerlake.format.needs import FileNeeds
from singerlake.spark.executors import default_parallelism
from singerlake.spark.masters import is_connect
from singerlake.spark.results import arrow_without_pandas, result_batch, result_schema
from singerlake.storage import Storage
from singerlake.times import new_file_id

CHUNK_BYTES = 1 << 20
INLINE_GZIP_BYTES = 64 << 10  # smaller chunks (a short segment's tail) are gzipped at once: cheaper than a hand-off
RESULT_COLUMNS = {"segment": "long", "first_chunk": "long", "meta": "string"}
WRITE_THREADS = 8  # files an executor task stores at once (S3 puts wait on the network)
WRITE_BACKLOG_BYTES = 64 << 20  # gzipped bytes a task holds while its files are being stored


@dataclass(frozen=True)
class FileJob:
    """Everything an executor needs to write one segment's files (pickled into the task)."""

    storage: Storage
    paths: StreamPaths
    schema_hash: str
    schema_member: bytes  # the SCHEMA line as a gzip member: the head of every file
    max_file_bytes: int
    work_id: str | None
    properties: dict  # the schema's properties: each file's column statistics are found under them (SPEC.md §5)


@dataclass
class Chunk:
    """Consecutive newline-terminated lines as one gzip member, with their count, size and time range."""

    member: bytes | Future[bytes]  # a Future while the driver's compressor pool works on it
    raw_bytes: int
    records: int
    start: int
    end: int


class ChunkCompressor:
    """Gzips sealed chunks on a thread pool; zlib releases the GIL, so reading goes on meanwhile.

    At most two chunks per thread wait uncompressed: when compression falls behind, ``chunk``
    waits, so the raw text held stays a few MiB however fast the input comes.
    """

    def __init__(self, compresslevel: int, threads: int | None = None):
        self.compresslevel = compresslevel
        threads = threads or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="singerlake-gzip")
        self._pending: deque[Future[bytes]] = deque()
        self._max_pending = 2 * threads

    def chunk(self, lines: bytes | bytearray, records: int, start: int, end: int) -> Chunk:
        if len(lines) < INLINE_GZIP_BYTES:
            return Chunk(gzip_member(lines, self.compresslevel), len(lines), records, start, end)
        while self._pending and (self._pending[0].done() or len(self._pending) >= self._max_pending):
            self._pending.popleft().result()
        member = self._pool.submit(gzip_member, lines, self.compresslevel)
        self._pending.append(member)
        return Chunk(member, len(lines), records, start, end)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def batch_table(segments: list[list[Chunk]]):
    """The Arrow table a batch's DataFrame is made from: one row per chunk, segment after segment, in order.

    Each chunk carries the id of the file it would start, drawn here in record order: a file takes
    its first chunk's id, so a stream's file ids follow its records however executors schedule
    their writes (a rebuild orders files by id, SPEC.md §7).
    """
    import pyarrow as pa

    chunks = [chunk for segment in segments for chunk in segment]
    members = [chunk.member if isinstance(chunk.member, bytes) else chunk.member.result() for chunk in chunks]
    offsets = [0]
    for member in members:
        offsets.append(offsets[-1] + len(member))
    joined = pa.py_buffer(b"".join(members))
    data = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(chunks), [None, pa.array(offsets, pa.int64()).buffers()[1], joined])
    return pa.table(
        {
            "segment": pa.array([index for index, segment in enumerate(segments) for _ in segment], pa.int64()),
            "seq": pa.array([seq for segment in segments for seq in range(len(segment))], pa.int64()),
            "file_id": pa.array([new_file_id() for _ in chunks], pa.string()),
            "data": data,
            "raw_bytes": pa.array([c.raw_bytes for c in chunks], pa.int64()),
            "records": pa.array([c.records for c in chunks], pa.int64()),
            "start": pa.array([c.start for c in chunks], pa.int64()),
            "end": pa.array([c.end for c in chunks], pa.int64()),
        }
    )


class _FileBuilder:
    def __init__(self, segment: int, job: FileJob, first_chunk: int, file_id: str):
        self.segment = segment
        self.job = job
        self.first_chunk = first_chunk
        self.file_id = file_id
        self.stored_bytes = len(job.schema_member)
        self.parts = [job.schema_member]
        self.counts: list[int] = []  # the records of each RECORD member
        self.raw_bytes = 0
        self.records = 0
        self.start, self.end = math.inf, -math.inf

    def add(self, member: memoryview, raw_bytes: int, records: int, start: int, end: int) -> None:
        self.parts.append(member)
        self.counts.append(records)
        self.stored_bytes += len(member)
        self.raw_bytes += raw_bytes
        self.records += records
        self.start, self.end = min(self.start, start), max(self.end, end)

    def store(self) -> dict:
        """Write the file; its metadata record. (Waits on storage mostly: its statistics are found meanwhile.)"""
        job = self.job
        data = b"".join(self.parts)
        start, end = int(self.start), int(self.end)
        return store(job.storage, job.paths, job.schema_hash, data, start, end, self.records, job.work_id, self.file_id)

    def statistics(self) -> dict:
        """The file's column statistics (SPEC.md §5), from its RECORD members: decoded once more here, so no reader has to."""
        needs = FileNeeds(self.job.properties)
        for member, records in zip(self.parts[1:], self.counts, strict=True):
            needs.add_member(member, records)
        return needs.fields()

    def row(self, record: dict, statistics: dict) -> tuple[int, int, str]:
        return self.segment, self.first_chunk, json.dumps({**record, **statistics})


def _chunks(batch) -> Iterator[tuple[int, int, str, memoryview, int, int, int, int]]:
    """Rows of a chunk batch, with the data as zero-copy views of the Arrow buffer."""
    import pyarrow as pa

    data = batch.column("data")
    width = "q" if pa.types.is_large_binary(data.type) else "i"  # Spark may send binary or large_binary
    offsets = memoryview(data.buffers()[1]).cast(width)[data.offset : data.offset + len(data) + 1]
    payload = memoryview(data.buffers()[2])
    rows = zip(
        batch.column("segment").to_pylist(),
        batch.column("seq").to_pylist(),
        batch.column("file_id").to_pylist(),
        batch.column("raw_bytes").to_pylist(),
        batch.column("records").to_pylist(),
        batch.column("start").to_pylist(),
        batch.column("end").to_pylist(),
        strict=True,
    )
    for index, (segment, seq, file_id, raw_bytes, records, start, end) in enumerate(rows):
        yield segment, seq, file_id, payload[offsets[index] : offsets[index + 1]], raw_bytes, records, start, end


def write_partition(jobs: list[FileJob], batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body: chunks in, one row of metadata per data file written out.

    A file never spans two segments. Finished files are stored on a few threads, so a task
    holding many small segments (one per stream) is not one storage round trip per file in a row.
    """
    stored: list[tuple[int, int, str]] = []
    with ThreadPoolExecutor(WRITE_THREADS, thread_name_prefix="singerlake-store") as pool:
        pending: deque[tuple[_FileBuilder, Future, Future]] = deque()  # a file's statistics and its store, side by side
        backlog = 0  # gzipped bytes of the files in ``pending``

        def done(builder: _FileBuilder, statistics: Future, record: Future) -> None:
            nonlocal backlog
            stored.append(builder.row(record.result(), statistics.result()))
            backlog -= builder.stored_bytes

        def finish(builder: _FileBuilder) -> None:
            nonlocal backlog
            while pending and ((pending[0][1].done() and pending[0][2].done()) or backlog >= WRITE_BACKLOG_BYTES):
                done(*pending.popleft())
            pending.append((builder, pool.submit(builder.statistics), pool.submit(builder.store)))
            backlog += builder.stored_bytes

        builder = None
        for batch in batches:
            for segment, seq, file_id, member, raw_bytes, records, start, end in _chunks(batch):
                if builder is not None and builder.segment != segment:
                    finish(builder)
                    builder = None
                if builder is None:
                    builder = _FileBuilder(segment, jobs[segment], seq, file_id)
                builder.add(member, raw_bytes, records, start, end)
                if builder.raw_bytes >= jobs[segment].max_file_bytes:
                    finish(builder)
                    builder = None
        if builder is not None:
            finish(builder)
        while pending:
            done(*pending.popleft())
    segments, firsts, metas = zip(*stored, strict=True) if stored else ((), (), ())
    yield result_batch(RESULT_COLUMNS, segment=list(segments), first_chunk=list(firsts), meta=list(metas))


def write_with_spark(spark, jobs: list[FileJob], table) -> list[list[dict[str, Any]]]:
    """Run one Spark job writing a ``batch_table``; returns each segment's file records in record order."""
    parallelism = default_parallelism(spark)
    # Spark cuts a local Arrow table into partitions of this many rows: spread chunks over the cores.
    per_partition = max(1, math.ceil(table.num_rows / parallelism))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(per_partition))
    frame = spark.createDataFrame(table)
    rows = frame.mapInArrow(lambda batches: write_partition(jobs, batches), result_schema(**RESULT_COLUMNS)).collect()
    return _files_of(jobs, rows)


def write_here(jobs: list[FileJob], segments: list[list[Chunk]]) -> list[list[dict[str, Any]]]:
    """The same work as ``write_with_spark``, in this process: for a run whose only batch came before Spark
    began to start on this machine (its executors would be this machine anyway)."""
    arrow_without_pandas()  # Spark never starts in this run: nothing else imports pandas meanwhile
    table = batch_table(segments)
    return _files_of(jobs, [row for batch in write_partition(jobs, iter(table.to_batches())) for row in batch.to_pylist()])


def _files_of(jobs: list[FileJob], rows: list) -> list[list[dict[str, Any]]]:
    """Each segment's file records, in record order, from the rows ``write_partition`` yields."""
    files: list[list[dict[str, Any]]] = [[] for _ in jobs]
    for row in sorted(rows, key=lambda row: (row["segment"], row["first_chunk"])):
        files[row["segment"]].append(json.loads(row["meta"]))
    return files


def _warm_partition(batches: Iterator[Any]) -> Iterator[Any]:
    import singerlake.landing.spark_write  # noqa: F401  (the import is the point: workers start warm)

    yield result_batch(RESULT_COLUMNS, segment=[0], first_chunk=[sum(batch.num_rows for batch in batches)], meta=[""])


def warm_up(spark) -> None:
    """Start the Python workers and load their imports while the first batch is still being read."""
    table = batch_table([[Chunk(gzip_member(b"{}\n", 1), 3, 1, 0, 0)] * (2 * default_parallelism(spark))])
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2")
    spark.createDataFrame(table).mapInArrow(_warm_partition, result_schema(**RESULT_COLUMNS)).collect()


def preload_spark_imports() -> None:
    """Imports the first batch's Spark job would make on its critical path (createDataFrame always
    imports pandas: ~0.2 s of CPU), made while the drain waits for Spark to start instead."""
    try:
        import pandas  # noqa: F401
    except ImportError:  # optional for Spark: createDataFrame of an Arrow table works without it
        pass


def label_jobs(spark, group: str, description: str) -> None:
    """Name the batch's Spark job in the UI and the status tracker (Spark Connect has no job groups)."""
    if not is_connect(spark):
        spark.sparkContext.setJobGroup(group, description)


def jobs_in_group(spark, group: str) -> int | None:
    return None if is_connect(spark) else len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))
