"""``singerlake project``: raw -> ``staging/`` (current row per key) -> ``published/`` (Parquet, CSV).

Per stream, a run reads only the records committed since the last run (the position recorded in
``staging/<tap>/<stream>/_processed.json``, like a pipeline manifest's PROCESSED state), merges
them with the previous staging snapshot, keeps the latest row per key (by commit, then record
time, then position: later wins) and writes a new snapshot:

    staging/<tap>/<stream>/<run>/part-NNNNN.parquet     current rows with _singerlake_* columns
    published/<tap>/<stream>/<run>/part-NNNNN.parquet   the same rows, stream properties only
    published/<tap>/<stream>/<run>/part-NNNNN.csv       nested values as JSON text

Streams are planned together on the driver. Small streams (new stored bytes plus the previous
snapshot up to ``SMALL_STREAM_BYTES``) are projected in ONE Spark job, one work item per stream:
the executor reads the stream's new records (verified, with the data source's reader), merges the
previous snapshot and keeps the current rows with pyarrow (``project_rows``). A shuffle per small
stream would cost far more than the work. Larger streams go through Spark SQL (the ``singerlake``
data source and a window per key), with shuffle partitions sized from their bytes.

Files are written by the executors through the lake's storage (local or S3); ``_processed.json``
is then swapped atomically to name the new run, so readers never see a half-written snapshot.
A stream without key properties is append-only: every record is a current row.
"""

from __future__ import annotations

import functools
import io
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import date, datetime, timezone
from itertools import islice
from typing import Any

from singerlake.catalogue import replay_schema
from singerlake.commit import compare_and_swap
from singerlake.datasource import POSITION_COLUMNS, columns, file_rows, plan_files, register
from singerlake.jobs import Failures, Progress, StreamFailure, for_each_stream, run_stream_items, selected_streams
from singerlake.lake import Lake
from singerlake.manifest import Manifest
from singerlake.paths import encode_segment, iso_ms, new_file_id, now_ms
from singerlake.replay import Position, check_bookmark
from singerlake.spark_schema import arrow_schema
from singerlake.storage import NotFound, Storage

SMALL_STREAM_BYTES = 64 << 20  # stored (gzipped) bytes; decoded rows take several times that in memory
# Stored bytes per shuffle partition of a large stream: gzipped records take 4-8x that as rows.
SHUFFLE_PARTITION_BYTES = 32 << 20
STREAMS_PER_TASK = 16
THREADS_PER_TASK = 2  # a small stream's work is mostly Python (JSON, rows): more threads only hold more memory
ARROW_BATCH_ROWS = 8192
FORMATS = ("parquet", "csv")
WRITTEN_SCHEMA = "path string, rows long"
META = [field.name for field in POSITION_COLUMNS]
NO_TIME = -(2**63)  # a row without a record time loses to any row with one (the window's nulls last)


def _stream_key(area: str, tap_id: str, stream: str) -> str:
    return f"{area}/{encode_segment(tap_id)}/{encode_segment(stream)}"


# -- the projection of one stream: (previous staging rows, new records) -> (new staging, published) --
def current_rows(table, keys: list[str]):
    """The latest row per key: by commit, then record time (a row without one loses), then position.

    Rows come out in position order. Without key properties every row is current.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if not keys or not table.num_rows:
        return table
    order = pa.table(
        {
            "commit": table["_singerlake_commit"],
            "time": pc.fill_null(table["_singerlake_time"].cast(pa.int64()), NO_TIME),
            "index": table["_singerlake_index"],
        }
    )
    ordered = table.take(pc.sort_indices(order, [("commit", "ascending"), ("time", "ascending"), ("index", "ascending")]))
    grouping = {f"key{i}": _groupable(ordered[name]) for i, name in enumerate(keys)}
    ranked = pa.table({**grouping, "rank": pa.array(range(ordered.num_rows), pa.int64())})
    latest = ranked.group_by(list(grouping), use_threads=False).aggregate([("rank", "max")])["rank_max"]
    return ordered.take(latest.sort())


def _groupable(column):
    """Arrow groups by scalar columns only: a nested key is grouped by its JSON text."""
    import pyarrow as pa

    return _json_texts(column) if pa.types.is_nested(column.type) else column


def project_rows(previous, new, keys: list[str]):
    """The new staging rows (current row per key) and the published rows (stream properties only)."""
    import pyarrow as pa

    current = current_rows(pa.concat_tables([previous, new]), keys)
    return current, current.drop_columns(META)


def read_staging(storage: Storage, keys: list[str], target):
    """Staging Parquet files as one table of Arrow schema ``target``: columns the stream gained since
    are null, columns it lost are dropped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [target.empty_table()]
    for key in keys:
        table = pq.read_table(io.BytesIO(storage.read(key).data))
        parts = [
            table[name] if name in table.column_names else pa.nulls(table.num_rows, field.type)
            for name, field in zip(target.names, target, strict=True)
        ]
        tables.append(pa.table(parts, names=target.names).cast(target))
    return pa.concat_tables(tables)


def read_new_records(storage: Storage, schema, files: list[dict], target):
    """The records of planned data files (``datasource.plan_files``) as one table of Arrow schema
    ``target``, read as the data source reads them."""
    import pyarrow as pa

    batches = []
    for file in files:
        rows = file_rows(storage, schema, file)
        while chunk := list(islice(rows, ARROW_BATCH_ROWS)):
            arrays = [pa.array(values, field.type) for values, field in zip(zip(*chunk, strict=True), target, strict=True)]
            batches.append(pa.RecordBatch.from_arrays(arrays, schema=target))
    return pa.Table.from_batches(batches, schema=target)


def csv_ready(table):
    """Nested values (structs, lists) as JSON text: CSV cells hold scalars only."""
    import pyarrow as pa

    for index, field in enumerate(table.schema):
        if pa.types.is_nested(field.type):
            table = table.set_column(index, field.name, _json_texts(table.column(index)))
    return table


def _json_texts(column):
    import pyarrow as pa

    def text(value: Any) -> str | None:
        return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_json_value)

    return pa.array([text(value) for value in column.to_pylist()], pa.string())


def _json_value(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def write_part(storage: Storage, prefix: str, fmt: str, table) -> str | None:
    """``table`` as one new Parquet or CSV file under ``prefix`` (create-only); None when it has no rows."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if not table.num_rows:
        return None
    buffer = io.BytesIO()
    if fmt == "parquet":
        pq.write_table(table, buffer)
    else:
        pacsv.write_csv(csv_ready(table), buffer)
    key = f"{prefix}/part-{new_file_id()}.{fmt}"
    storage.write(key, buffer.getvalue(), if_none_match=True)
    return key


# -- planning on the driver ----------------------------------------------------------------------
@dataclass
class StreamPlan:
    tap_id: str
    stream: str
    manifest: Manifest
    processed: dict | None  # the last run's _processed.json
    end: Position  # the stream's end: what _processed.json records after this run
    run: str
    up_to_date: bool = False
    files: list[dict] = dataclass_field(default_factory=list)  # data files holding new records (datasource.plan_files)
    previous_bytes: int = 0  # bytes of the previous staging snapshot

    @property
    def staging(self) -> str:
        return _stream_key("staging", self.tap_id, self.stream)

    @property
    def staging_run(self) -> str:
        return f"{self.staging}/{self.run}"

    @property
    def published_run(self) -> str:
        return f"{_stream_key('published', self.tap_id, self.stream)}/{self.run}"

    @property
    def previous_files(self) -> list[str]:
        return self.processed["files"] if self.processed else []

    @property
    def new_records(self) -> int:
        return sum(f["entry"]["records"] - f["skip"] for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f["entry"]["size"] for f in self.files) + self.previous_bytes

    @property
    def keys(self) -> list[str]:
        return self.manifest.versions[self.manifest.latest_hash()]["key_properties"]

    def schema(self):
        return columns(replay_schema(self.manifest))

    def summary(self) -> dict:
        """The stream as the last run left it."""
        staging, rows = (self.processed["staging"], self.processed["rows"]) if self.processed else (None, 0)
        return {"tap_id": self.tap_id, "stream": self.stream, "staging": staging, "rows": rows, "new_records": 0}


def plan_stream(lake: Lake, tap_id: str, stream: str) -> StreamPlan:
    staging = _stream_key("staging", tap_id, stream)
    try:
        processed = json.loads(lake.storage.read(f"{staging}/_processed.json").data)
    except NotFound:
        processed = None
    manifest = lake.manifest(tap_id, stream)
    end = Position(*manifest.end_position(), manifest.generation)
    after = Position.from_bookmark(processed["position"], stream) if processed else None
    check_bookmark(after, manifest)
    run = f"{iso_ms(now_ms()).replace(':', '').replace('-', '')}-{new_file_id()[:12]}"
    plan = StreamPlan(tap_id, stream, manifest, processed, end, run)
    if (after is not None and after >= end) or not manifest.versions:
        plan.up_to_date = True
        return plan
    plan.files = plan_files(manifest, set(manifest.versions), after, manifest.commits)
    if processed:
        previous = set(processed["files"])
        plan.previous_bytes = sum(info.size for info in lake.storage.list(f"{processed['staging']}/") if info.key in previous)
    return plan


def _work_item(plan: StreamPlan, formats: list[str], timezone: str) -> dict:
    return {
        "tap_id": plan.tap_id,
        "stream": plan.stream,
        "schema": plan.schema().json(),
        "keys": plan.keys,
        "files": plan.files,
        "previous": plan.previous_files,
        "staging": plan.staging_run,
        "published": plan.published_run,
        "formats": formats,
        "timezone": timezone,  # timestamps are labelled with Spark's session time zone, as Spark's own output is
    }


# -- small streams: one work item each, all in one Spark job ---------------------------------------
def project_on_executor(storage: Storage, item: dict) -> dict:
    """Executor side: project one small stream and write its staging and published files."""
    from pyspark.sql import types as T

    schema = T.StructType.fromJson(json.loads(item["schema"]))
    target = arrow_schema(schema, item["timezone"])
    previous = read_staging(storage, item["previous"], target)
    new = read_new_records(storage, schema, item["files"], target)
    staged, published = project_rows(previous, new, item["keys"])
    files = [write_part(storage, item["staging"], "parquet", staged)]
    for fmt in item["formats"]:
        write_part(storage, item["published"], fmt, published)
    return {"files": sorted(key for key in files if key), "rows": staged.num_rows}


def project_small_streams(lake: Lake, spark, plans: list[StreamPlan], formats: list[str], failures: Failures, progress) -> dict:
    timezone = spark.conf.get("spark.sql.session.timeZone") if plans else "UTC"
    items = [_work_item(plan, formats, timezone) for plan in plans]
    work = functools.partial(project_on_executor, lake.storage)
    options = {"items_per_task": STREAMS_PER_TASK, "threads": THREADS_PER_TASK, "sizes": [plan.bytes for plan in plans]}
    results = run_stream_items(spark, items, work, failures, progress, **options)
    return {(plan.tap_id, plan.stream): result for plan, result in zip(plans, results, strict=True) if result is not None}


# -- large streams: Spark SQL ----------------------------------------------------------------------
def _write_parts(storage: Storage, prefix: str, fmt: str, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: this partition's rows as one Parquet or CSV file under ``prefix``."""
    import pyarrow as pa

    collected = [batch for batch in batches if batch.num_rows]
    key = write_part(storage, prefix, fmt, pa.Table.from_batches(collected)) if collected else None
    if key is None:
        yield pa.RecordBatch.from_pydict({"path": pa.array([], pa.string()), "rows": pa.array([], pa.int64())})
        return
    yield pa.RecordBatch.from_pydict({"path": [key], "rows": pa.array([sum(b.num_rows for b in collected)], pa.int64())})


def _read_parts(storage: Storage, schema, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: the staging Parquet files named in the input, cast to the current schema."""
    target = arrow_schema(schema)
    for batch in batches:
        for key in batch.column("path").to_pylist():
            yield from read_staging(storage, [key], target).to_batches()


def _write(frame, storage: Storage, prefix: str, fmt: str) -> tuple[list[str], int]:
    rows = frame.mapInArrow(functools.partial(_write_parts, storage, prefix, fmt), WRITTEN_SCHEMA).collect()
    return sorted(row["path"] for row in rows), sum(row["rows"] for row in rows)


def _window_current_rows(frame, keys: list[str]):
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not keys:
        return frame
    latest = Window.partitionBy(*keys).orderBy(
        F.col("_singerlake_commit").desc(), F.col("_singerlake_time").desc_nulls_last(), F.col("_singerlake_index").desc()
    )
    return frame.withColumn("_row", F.row_number().over(latest)).filter("_row = 1").drop("_row")


@contextmanager
def _shuffle_partitions(spark, data_bytes: int):
    """Shuffle partitions sized from the stream's bytes, not the session's default."""
    before = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(max(1, math.ceil(data_bytes / SHUFFLE_PARTITION_BYTES))))
    try:
        yield
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)


def project_large_stream(lake: Lake, spark, plan: StreamPlan, formats: list[str]) -> dict:
    register(spark)
    reader = spark.read.format("singerlake").option("tap_id", plan.tap_id).option("stream", plan.stream)
    reader = reader.option("until_commit", str(plan.manifest.commits))
    for name, value in lake.storage.open_options().items():
        reader = reader.option(f"s3_{name}", value)
    if plan.processed:
        reader = reader.option("after", json.dumps(plan.processed["position"]))
    rows = new = reader.load(lake.storage.url)
    if plan.previous_files:
        keys_frame = spark.createDataFrame([(path,) for path in plan.previous_files], "path string")
        previous = keys_frame.mapInArrow(functools.partial(_read_parts, lake.storage, new.schema), new.schema)
        rows = previous.unionByName(new)
    with _shuffle_partitions(spark, plan.bytes):
        current = _window_current_rows(rows, plan.keys).cache()
        staged, count = _write(current, lake.storage, plan.staging_run, "parquet")
        for fmt in formats:
            _write(current.drop(*META), lake.storage, plan.published_run, fmt)
        current.unpersist()
    return {"files": staged, "rows": count}


# -- the job ---------------------------------------------------------------------------------------
def commit_run(lake: Lake, plan: StreamPlan, written: dict) -> dict:
    """Swap ``_processed.json`` to the new run: the last step, so a crash leaves the previous snapshot current."""
    doc = {
        "position": plan.end.to_bookmark(),
        "staging": plan.staging_run,
        "published": plan.published_run,
        "files": written["files"],
        "rows": written["rows"],
        "processed_at": iso_ms(now_ms()),
    }
    compare_and_swap(lake.storage, f"{plan.staging}/_processed.json", lambda _: json.dumps(doc, indent=1).encode())
    return {**plan.summary(), "staging": doc["staging"], "rows": doc["rows"], "new_records": plan.new_records}


def project(
    lake: Lake,
    spark,
    tap_id: str | None = None,
    stream: str | None = None,
    formats: list[str] | None = None,
    small_stream_bytes: int = SMALL_STREAM_BYTES,
    progress: Progress | None = None,
    failures: list[StreamFailure] | None = None,
) -> list[dict]:
    """Project the selected streams. A stream that fails is added to ``failures`` (its previous
    snapshot stays current) and the others are projected; without ``failures``, StreamsFailed is
    raised at the end."""
    lake.check_exists()
    formats = formats or list(FORMATS)
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown published formats {sorted(unknown)}; use parquet and/or csv")
    found = Failures()
    plans = for_each_stream(selected_streams(lake, tap_id, stream), lambda tap, name: plan_stream(lake, tap, name), found)
    pending = [plan for plan in plans.values() if not plan.up_to_date]
    small = [plan for plan in pending if plan.bytes <= small_stream_bytes]
    written = project_small_streams(lake, spark, small, formats, found, progress)
    large = {(plan.tap_id, plan.stream): plan for plan in pending if plan.bytes > small_stream_bytes}
    written |= for_each_stream(list(large), lambda tap, name: project_large_stream(lake, spark, large[(tap, name)], formats), found, 1)
    committed = for_each_stream(list(written), lambda tap, name: commit_run(lake, plans[(tap, name)], written[(tap, name)]), found)
    results = [committed.get(stream_id) or plan.summary() for stream_id, plan in plans.items() if not found.has(*stream_id)]
    found.deliver(failures)
    return results
