"""``singerlake project``: raw -> ``staging/`` (current row per key) -> ``published/`` (Parquet, CSV).

Per stream, a run reads only the records committed since the last run (the position recorded in
``staging/<tap>/<stream>/_processed.json``, like a pipeline manifest's PROCESSED state) through
the ``singerlake`` data source, merges them with the previous staging snapshot, keeps the latest
row per key (by commit, then record time, then position: later wins) and writes a new snapshot:

    staging/<tap>/<stream>/<run>/part-NNNNN.parquet     current rows with _singerlake_* columns
    published/<tap>/<stream>/<run>/part-NNNNN.parquet   the same rows, stream properties only
    published/<tap>/<stream>/<run>/part-NNNNN.csv       nested values as JSON text

Files are written by the executors through the lake's storage (local or S3); ``_processed.json``
is then swapped atomically to name the new run, so readers never see a half-written snapshot.
A stream without key properties is append-only: every record is a current row.
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Iterator
from typing import Any

from singerlake.commit import compare_and_swap
from singerlake.datasource import POSITION_COLUMNS, register
from singerlake.lake import Lake
from singerlake.paths import encode_segment, iso_ms, new_file_id, now_ms
from singerlake.replay import Position, check_bookmark, end_of, file_runs
from singerlake.storage import NotFound, Storage

WRITTEN_SCHEMA = "path string, rows long"
META = [field.name for field in POSITION_COLUMNS]


def _stream_key(area: str, tap_id: str, stream: str) -> str:
    return f"{area}/{encode_segment(tap_id)}/{encode_segment(stream)}"


def _write_parts(storage: Storage, prefix: str, fmt: str, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: this partition's rows as one Parquet or CSV file under ``prefix``."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    collected = [batch for batch in batches if batch.num_rows]
    if not collected:
        yield pa.RecordBatch.from_pydict({"path": pa.array([], pa.string()), "rows": pa.array([], pa.int64())})
        return
    table = pa.Table.from_batches(collected)
    buffer = io.BytesIO()
    if fmt == "parquet":
        pq.write_table(table, buffer)
    else:
        pacsv.write_csv(table, buffer)
    key = f"{prefix}/part-{new_file_id()}.{fmt}"
    storage.write(key, buffer.getvalue(), if_none_match=True)
    yield pa.RecordBatch.from_pydict({"path": [key], "rows": pa.array([table.num_rows], pa.int64())})


def _read_parts(storage: Storage, schema, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: the staging Parquet files named in the input, cast to the current schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    target = pa.schema([pa.field(f.name, _arrow_type(f.dataType)) for f in schema.fields])
    for batch in batches:
        for key in batch.column("path").to_pylist():
            table = pq.read_table(io.BytesIO(storage.read(key).data))
            columns = [
                table[name] if name in table.column_names else pa.nulls(table.num_rows, field.type)
                for name, field in zip(target.names, target, strict=True)
            ]
            yield from pa.table(columns, names=target.names).cast(target).to_batches()


def _arrow_type(data_type):
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(data_type, timezone="UTC")


def _write(frame, storage: Storage, prefix: str, fmt: str) -> list[str]:
    rows = frame.mapInArrow(functools.partial(_write_parts, storage, prefix, fmt), WRITTEN_SCHEMA).collect()
    return sorted(row["path"] for row in rows)


def _current_rows(frame, keys: list[str]):
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not keys:
        return frame
    latest = Window.partitionBy(*keys).orderBy(
        F.col("_singerlake_commit").desc(), F.col("_singerlake_time").desc_nulls_last(), F.col("_singerlake_index").desc()
    )
    return frame.withColumn("_row", F.row_number().over(latest)).filter("_row = 1").drop("_row")


def _csv_ready(frame):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    nested = (T.StructType, T.ArrayType, T.MapType)
    return frame.select(
        *[F.to_json(F.col(f.name)).alias(f.name) if isinstance(f.dataType, nested) else F.col(f.name) for f in frame.schema.fields]
    )


def project_stream(lake: Lake, spark, tap_id: str, stream: str, formats: list[str]) -> dict:
    register(spark)
    staging = _stream_key("staging", tap_id, stream)
    processed_key = f"{staging}/_processed.json"
    try:
        processed = json.loads(lake.storage.read(processed_key).data)
    except NotFound:
        processed = None
    manifest = lake.manifest(tap_id, stream)
    placed = file_runs(manifest)
    end = max((end_of(runs, manifest.generation) for _, runs in placed), default=Position(0, 0, manifest.generation))
    after = Position.from_bookmark(processed["position"], stream) if processed else None
    check_bookmark(after, manifest)
    summary = {"stream": stream, "staging": processed["staging"] if processed else None, "rows": processed["rows"] if processed else 0}
    if after is not None and after >= end:
        return {**summary, "new_records": 0}

    reader = spark.read.format("singerlake").option("tap_id", tap_id).option("stream", stream).option("until_commit", str(manifest.commits))
    for name, value in lake.storage.open_options().items():
        reader = reader.option(f"s3_{name}", value)
    if after is not None:
        reader = reader.option("after", json.dumps(after.to_bookmark()))
    new = reader.load(lake.storage.url)
    new_records = new.count()
    rows = new
    if processed:
        keys_frame = spark.createDataFrame([(path,) for path in processed["files"]], "path string")
        previous = keys_frame.mapInArrow(functools.partial(_read_parts, lake.storage, new.schema), new.schema)
        rows = previous.unionByName(new)
    keys = manifest.versions[manifest.latest_hash()]["key_properties"]
    current = _current_rows(rows, keys).cache()
    run = f"{iso_ms(now_ms()).replace(':', '').replace('-', '')}-{new_file_id()[:12]}"
    staged = _write(current, lake.storage, f"{staging}/{run}", "parquet")
    published = _stream_key("published", tap_id, stream) + f"/{run}"
    properties = current.drop(*META)
    for fmt in formats:
        _write(_csv_ready(properties) if fmt == "csv" else properties, lake.storage, published, fmt)
    count = current.count()
    current.unpersist()
    doc = {
        "position": end.to_bookmark(),
        "staging": f"{staging}/{run}",
        "published": published,
        "files": staged,
        "rows": count,
        "processed_at": iso_ms(now_ms()),
    }
    compare_and_swap(lake.storage, processed_key, lambda _: json.dumps(doc, indent=1).encode())
    return {**summary, "staging": doc["staging"], "rows": count, "new_records": new_records}


def project(lake: Lake, spark, tap_id: str | None = None, stream: str | None = None, formats: list[str] | None = None) -> list[dict]:
    lake.check_exists()
    formats = formats or ["parquet", "csv"]
    unknown = set(formats) - {"parquet", "csv"}
    if unknown:
        raise ValueError(f"unknown published formats {sorted(unknown)}; use parquet and/or csv")
    results = []
    for tap in [tap_id] if tap_id else lake.taps():
        for name in [stream] if stream else lake.streams(tap):
            results.append(project_stream(lake, spark, tap, name, formats))
    return results
