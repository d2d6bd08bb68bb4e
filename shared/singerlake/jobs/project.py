"""``singerlake project``: raw -> ``staging/`` parts -> each stream's Delta table in ``published/`` (SPEC.md §12).

Per stream, a run reads only the records committed after the position the table's latest commit
records, keeps the current row per key (latest by commit, then record time, then position) and
changes only what must change:

    staging/<tap>/<stream>/part-<id>.parquet     current rows: _key, positions, _record (the record's JSON text)
    published/<tap>/<stream>/part-<id>.parquet   the same rows typed exactly (``exact``), one file per staging part
    published/<tap>/<stream>/_delta_log/         one Delta commit per run (``delta``), the only commit point
    published/<tap>/<stream>/_iceberg/           with ``iceberg``: the same files as an Iceberg table, one snapshot per run (``iceberg``)

A previous part holding a key a new record updates is rewritten without that row; the new current
rows form one new part; other parts stay. Column types come from the declared schema and the
values held (each part stores what its values need); when they change, every published file is
rewritten in that run's commit.

Small streams (new stored bytes plus previous parts up to ``SMALL_STREAM_BYTES``) are projected
in ONE Spark job, one work item per stream, with pyarrow on the executor; their new rows form parts
of at most ``PART_ROWS`` rows. New records are read in bulk: envelopes in one decoder call, records
by Arrow's JSON reader, typed as they are read under the types their files' column statistics give
(``format/columnar``; record by record with ``exact`` where Arrow cannot read a value exactly). Larger streams run a
Spark job each, incrementally too: their parts are **buckets** of keys (``crc32(_key) mod
buckets``), so only the buckets the new records touch are rewritten, each by one executor (its
previous part and its new rows). Both give the same rows and types.

Deletes (Singer's): a current record with ``_sdc_deleted_at``, and rows of older table versions placed
before an ACTIVATE_VERSION, stay with ``_sdc_deleted_at`` set (soft, the default) or are left out
(``hard_delete``); activations the table has not applied yet reach every previous part.
"""

from __future__ import annotations

import collections
import functools
import io
import math
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from singerlake.errors import ConfigError
from singerlake.format.catalogue import replay_schema
from singerlake.format.columnar import typed_texts
from singerlake.format.exact import decode, join, join_all, json_text, json_value, records_needs, table_schema, typed_table
from singerlake.format.manifest import Manifest
from singerlake.format.names import encode_segment
from singerlake.format.needs import StatsReader
from singerlake.format.positions import Position, check_bookmark
from singerlake.jobs import blocks, delta, iceberg
from singerlake.jobs.blocks import BLOCKS_PER_BATCH
from singerlake.jobs.runner import (
    Failures,
    Progress,
    StreamFailure,
    for_each_stream,
    run_items,
    run_stream_items,
    selected_streams,
)
from singerlake.jobs.staging import CPU_THREADS, conform, current_indices, read_new_records
from singerlake.lake import Lake
from singerlake.pause import pause_point
from singerlake.replay.datasource import plan_files
from singerlake.spark.executors import runs_elsewhere
from singerlake.spark.session import runs_here, session_of
from singerlake.storage import Storage
from singerlake.times import new_file_id

SMALL_STREAM_BYTES = 64 << 20  # stored (gzipped) bytes; decoded rows take several times that in memory
# A large stream's buckets start at a sixteenth of the small-stream size (small enough that an update
# rewrites little, and a write task holds little); when they average more than the whole size the
# stream is re-bucketed, so one bucket never costs an executor more than a small stream.
BUCKET_SHARE = 16
MIN_BUCKET_BYTES = 1 << 10
STREAMS_PER_TASK = 16
PART_ROWS = 1 << 18  # a small stream's new rows are parts of at most this many: an update rewrites the parts holding its keys
PARQUET = {"compression": "zstd", "use_dictionary": False}  # mostly unique values: a dictionary costs more than it saves (SPEC §12)
FORMATS = ("delta", "csv", "iceberg")
SDC_DELETED_AT = "_sdc_deleted_at"
DELETED_AT = {"type": ["string", "null"], "format": "date-time"}  # the column soft deletes add when the schema has none
DELETED_AT_IF_USED = {**DELETED_AT, "singerlake.added": "when used"}  # ... shown only once a row has a deletion time


# -- parts: a staging file and its published twin ------------------------------------------------------
def read_parquet(storage: Storage, key: str, columns: list[str] | None = None):
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(storage.read(key).data), columns=columns)


def records_of(staging) -> list[dict]:
    """The decoded records of staging rows; a row an ACTIVATE_VERSION deleted (soft) carries its time
    as ``_sdc_deleted_at`` unless the record has one of its own."""
    records = [decode(text) for text in staging["_record"].to_pylist()]
    records = [record if isinstance(record, dict) else {} for record in records]
    if "_singerlake_deleted_at" in staging.column_names:
        for record, deleted_at in zip(records, staging["_singerlake_deleted_at"].to_pylist(), strict=True):
            if deleted_at is not None and record.get(SDC_DELETED_AT) is None:
                record[SDC_DELETED_AT] = deleted_at
    return records


# -- deletes: _sdc_deleted_at and ACTIVATE_VERSION (SPEC.md §12) ---------------------------------------
def deletes_properties(properties: dict, hard: bool, activated: bool) -> dict:
    """The properties whose values parts record: the declared ones, plus (soft deletes) ``_sdc_deleted_at``
    when the schema does not declare it: always shown once the stream has an activation, else once used."""
    if hard or SDC_DELETED_AT in properties:
        return properties
    return {**properties, SDC_DELETED_AT: DELETED_AT if activated else DELETED_AT_IF_USED}


def table_properties(properties: dict, types: dict) -> dict:
    """The published columns: an added ``_sdc_deleted_at`` no row uses yet is left out."""
    if properties.get(SDC_DELETED_AT) == DELETED_AT_IF_USED and types.get(SDC_DELETED_AT) is None:
        return {name: spec for name, spec in properties.items() if name != SDC_DELETED_AT}
    return properties


def run_types(parts: list[dict], properties: dict, previous: dict) -> dict:
    """The table's column types: the join of its parts' needs. An added ``_sdc_deleted_at`` the table
    showed stays (its previous need joined in), so the column does not come and go with its rows."""
    types = join_all([part["needs"] for part in parts])
    if properties.get(SDC_DELETED_AT) == DELETED_AT_IF_USED and previous.get(SDC_DELETED_AT) is not None:
        types[SDC_DELETED_AT] = join(types.get(SDC_DELETED_AT), previous[SDC_DELETED_AT])
    return types


def record_deleted(text: str) -> bool:
    if f'"{SDC_DELETED_AT}"' not in text:  # most records: no need to decode them
        return False
    record = decode(text)
    return isinstance(record, dict) and record.get(SDC_DELETED_AT) is not None


def apply_deletes(table, activations: list[dict], hard: bool):
    """Current rows (conformed staging rows) with deletes applied: each activation deletes the rows placed
    before it whose table version is older or none (the first one names their ``_singerlake_deleted_at``);
    ``hard`` leaves out those rows and those whose record has ``_sdc_deleted_at``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not table.num_rows:
        return table
    deleted = table["_singerlake_deleted_at"]
    if activations:
        commit, index, version = table["_singerlake_commit"], table["_singerlake_index"], table["_singerlake_table_version"]
        for activation in activations:
            place = activation["after_commit"]
            before = pc.or_(pc.less(commit, place), pc.and_(pc.equal(commit, place), pc.less(index, activation["records"])))
            older = pc.or_(pc.is_null(version), pc.fill_null(pc.less(version, activation["version"]), False))
            hit = pc.and_(pc.and_(before, older), pc.is_null(deleted))
            deleted = pc.if_else(hit, pa.scalar(activation["received"], pa.string()), deleted)
        table = table.set_column(table.schema.get_field_index("_singerlake_deleted_at"), "_singerlake_deleted_at", deleted)
    if hard:
        texts = table["_record"].to_pylist()
        keep = [at is None and not record_deleted(text) for at, text in zip(deleted.to_pylist(), texts, strict=True)]
        table = table.filter(pa.array(keep, pa.bool_()))
    return table


def deletes_changed(before, after) -> bool:
    return after.num_rows != before.num_rows or after["_singerlake_deleted_at"].null_count != before["_singerlake_deleted_at"].null_count


def part_deletes(storage: Storage, work: dict) -> dict:
    """A previous part under the run's new activations: ``{"part"}`` unchanged, or ``{"replaced", "part"}``
    with its rewritten staging part (unpublished; ``None`` when no row is left)."""
    part = work["part"]
    staging = conform(read_parquet(storage, part["staging"]))
    rows = apply_deletes(staging, work["activations"], work["hard"])
    if not deletes_changed(staging, rows):
        return {"part": part}
    if not rows.num_rows:
        return {"replaced": part, "part": None}
    written = write_staging(storage, work["staging"], rows, work["properties"])
    return {"replaced": part, "part": written | ({"bucket": part["bucket"]} if "bucket" in part else {})}


def typed_rows(properties: dict, types: dict, staging):
    """A part's published rows from its staging rows: read by Arrow where it reads them exactly
    (``columnar``), else record by record (``exact``); the same rows either way."""
    columns = table_properties(properties, types)
    deleted = "_singerlake_deleted_at" in staging.column_names and staging["_singerlake_deleted_at"].null_count < staging.num_rows
    typed = None if deleted else typed_texts(columns, types, staging["_record"])
    return typed if typed is not None else typed_table(columns, types, records_of(staging))


def write_staging(storage: Storage, prefix: str, staging, properties: dict, needs: dict | None = None) -> dict:
    """A new staging part (create-only) and what its values need (``needs``: known already, e.g. from
    the statistics of the files its rows came from; else found by decoding them). zstd: JSON text
    compresses about as the raw zone's gzip does (snappy: twice that), so a part's stored size compares
    with the raw bytes that size a large stream's buckets."""
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(staging, buffer, **PARQUET)
    key = f"{prefix}/part-{new_file_id()}.parquet"
    storage.write(key, buffer.getvalue(), if_none_match=True)
    if needs is None:
        needs = records_needs(properties, records_of(staging))
    return {"staging": key, "rows": staging.num_rows, "needs": needs}


def trim_part(storage: Storage, item: dict, part: dict, staging, keep) -> tuple[dict, Any]:
    """A previous part without its rows whose keys new records update (``keep``: the rows that stay),
    and its published rows filtered alike (a published file holds its staging rows in their order):
    nothing is decoded. Its needs stay the part's, so a column's type does not narrow when a row is
    updated (narrowing would change the table's schema under its readers and rewrite every file)."""
    trimmed = write_staging(storage, item["staging"], staging.filter(keep), item["properties"], needs=part["needs"])
    return trimmed, read_parquet(storage, f"{item['table']}/{part['published']}").filter(keep)


def publish(
    storage: Storage,
    table: str,
    part: dict,
    properties: dict,
    types: dict,
    csv: bool,
    staging=None,
    published=None,
) -> dict:
    """Write the part's published Parquet file (and CSV twin) from its staging rows (``staging``, else
    read from its staging file), or its rows typed already (``published``)."""
    import pyarrow.parquet as pq

    if published is None:
        published = typed_rows(properties, types, staging if staging is not None else read_parquet(storage, part["staging"]))
    buffer = io.BytesIO()
    pq.write_table(published, buffer, **PARQUET)
    name = f"part-{new_file_id()}.parquet"
    storage.write(f"{table}/{name}", buffer.getvalue(), if_none_match=True)
    part = {k: v for k, v in part.items() if k != "csv"} | {"published": name, "size": len(buffer.getvalue())}
    return write_csv_twin(storage, table, part, published) if csv else part


def write_csv_twin(storage: Storage, table: str, part: dict, published=None) -> dict:
    import pyarrow.csv as pacsv

    published = published if published is not None else read_parquet(storage, f"{table}/{part['published']}")
    buffer = io.BytesIO()
    pacsv.write_csv(csv_ready(published), buffer)
    key = f"{table}/_csv/{part['published'].removesuffix('.parquet')}.csv"
    storage.write(key, buffer.getvalue(), if_none_match=True)
    return {**part, "csv": key}


def csv_ready(table):
    """Nested values (structs, lists) as JSON text: CSV cells hold scalars only."""
    import pyarrow as pa

    for index, column in enumerate(table.schema):
        if pa.types.is_nested(column.type):
            texts = [None if v is None else json_text(json_value(v)) for v in table.column(index).to_pylist()]
            table = table.set_column(index, column.name, pa.array(texts, pa.string()))
    return table


# -- planning on the driver ----------------------------------------------------------------------
@dataclass
class StreamPlan:
    tap_id: str
    stream: str
    manifest: Manifest
    published: delta.Published
    end: Position  # the stream's end: what this run's commit records
    up_to_date: bool = False
    files: list[dict] = dataclass_field(default_factory=list)  # data files holding new records (datasource.plan_files)
    previous_bytes: int = 0  # bytes of the previous staging parts
    hard: bool = False  # hard deletes (SPEC.md §12); soft by default
    anew: bool = False  # the table's delete mode differs (or it has none): project the stream anew
    activations: list[dict] = dataclass_field(default_factory=list)  # the ACTIVATE_VERSIONs the table has not applied yet
    activated: int = 0  # the stream's ACTIVATE_VERSIONs: how many the table has applied after this run
    needs: dict | None = None  # what the new records need, from their files' statistics (None: a file has none)

    @property
    def table(self) -> str:
        return delta.table_key(self.tap_id, self.stream)

    @property
    def staging(self) -> str:
        return f"staging/{encode_segment(self.tap_id)}/{encode_segment(self.stream)}"

    @property
    def state(self) -> dict:
        return (not self.anew and self.published.state) or {"parts": [], "types": {}, "schema": None}

    @property
    def deletes(self) -> str:
        return "hard" if self.hard else "soft"

    @property
    def new_records(self) -> int:
        return sum(f["entry"]["records"] - f["skip"] for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f["entry"]["size"] for f in self.files) + self.previous_bytes

    @property
    def keys(self) -> list[str]:
        return self.manifest.versions[self.manifest.latest_hash()]["key_properties"]

    @property
    def properties(self) -> dict:
        return deletes_properties(replay_schema(self.manifest).get("properties", {}), self.hard, self.activated > 0)

    def summary(self, new_records: int = 0) -> dict:
        parts = self.state["parts"]
        return {
            "tap_id": self.tap_id,
            "stream": self.stream,
            "table": self.table,
            "version": self.published.version,
            "rows": sum(part["rows"] for part in parts),
            "new_records": new_records,
            "csv": [part["csv"] for part in parts if "csv" in part],
        }


def plan_stream(lake: Lake, tap_id: str, stream: str, hard: bool = False) -> StreamPlan:
    manifest = lake.manifest(tap_id, stream)
    published = delta.latest(lake.storage, delta.table_key(tap_id, stream))
    end = Position(*manifest.end_position(), manifest.generation)
    activations = manifest.activate_versions
    plan = StreamPlan(tap_id, stream, manifest, published, end, hard=hard, activated=len(activations))
    plan.anew = published.state is not None and published.state.get("deletes") != plan.deletes
    after = Position.from_bookmark(plan.state["position"], stream) if "position" in plan.state else None
    check_bookmark(after, manifest)
    plan.activations = activations[plan.state.get("activations", 0) :]
    if (after is not None and after >= end and not plan.activations) or not manifest.versions:
        plan.up_to_date = True
        return plan
    plan.files = plan_files(manifest, set(manifest.versions), after, manifest.commits)
    known, unread = StatsReader(manifest.versions, plan.properties).split(plan.files)
    plan.needs = None if unread else known
    sizes = {info.key: info.size for info in lake.storage.list(f"{plan.staging}/")}
    plan.previous_bytes = sum(sizes.get(part["staging"], 0) for part in plan.state["parts"])
    return plan


def _work_item(plan: StreamPlan, formats: list[str]) -> dict:
    return {
        "tap_id": plan.tap_id,
        "stream": plan.stream,
        "properties": plan.properties,
        "keys": plan.keys,
        "files": plan.files,
        "parts": plan.state["parts"],
        "schema": plan.state["schema"],
        "types": plan.state["types"],
        "staging": plan.staging,
        "table": plan.table,
        "csv": "csv" in formats,
        "hard": plan.hard,
        "activations": plan.activations,
        "needs": plan.needs,
    }


def schema_text(properties: dict, types: dict) -> str:
    """The published schema as text: equal text, equal column types (field metadata included)."""
    return table_schema(table_properties(properties, types), types).to_string(show_field_metadata=True, show_schema_metadata=False)


# -- small streams: one work item each, all in one Spark job ---------------------------------------
def project_on_executor(storage: Storage, item: dict) -> dict:
    """Executor side: project one small stream: rewrite the parts a new record updates, add the new
    current rows as one part, publish what changed (everything when the column types changed)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    properties, keyed, activations, hard = item["properties"], bool(item["keys"]), item["activations"], item["hard"]
    typing = None  # the column types if no part changes its needs: the new rows are typed as they are read
    if item["needs"] is not None and not activations:
        guess = run_types([*item["parts"], {"needs": item["needs"]}], properties, item["types"])
        typing = (table_properties(properties, guess), guess)
    read, typed = read_new_records(storage, item["keys"], item["files"], item["needs"], typing)
    rows = current_indices(read, keyed)
    new = read if rows is None else read.take(rows)
    typed = typed if typed is None or rows is None else typed.take(rows)
    updated = pc.unique(new["_key"]) if keyed and item["parts"] else pa.array([], pa.string())
    kept, replaced, fresh, trimmed = [], [], [], []
    for part in item["parts"]:
        if len(updated) and pc.any(pc.is_in(read_parquet(storage, part["staging"], ["_key"])["_key"], value_set=updated)).as_py():
            staging = conform(read_parquet(storage, part["staging"]))
            replaced.append(part)
            keep = pc.invert(pc.is_in(staging["_key"], value_set=updated))
            if activations or not pc.any(keep).as_py():  # deletes change published values: typed anew
                fresh.append(apply_deletes(staging.filter(keep), activations, hard))
            else:
                trimmed.append(trim_part(storage, item, part, staging, keep))
        elif activations:  # a refresh: rows of older table versions may be gone
            staging = conform(read_parquet(storage, part["staging"]))
            rows = apply_deletes(staging, activations, hard)
            if deletes_changed(staging, rows):
                replaced.append(part)
                fresh.append(rows)
            else:
                kept.append(part)
        else:
            kept.append(part)
    new = apply_deletes(new, activations, hard)
    if typed is not None and typed.num_rows != new.num_rows:  # hard deletes left rows out: typed again
        typed = None
    new_needs = None if activations else item["needs"]  # the files' statistics: not the deletion times activations add
    write = functools.partial(write_staging, storage, item["staging"], properties=properties)
    with ThreadPoolExecutor(CPU_THREADS) as pool:  # Parquet and zstd release the GIL
        written = list(pool.map(lambda rows: (write(staging=rows, needs=None), rows, None), [t for t in fresh if t.num_rows]))
        slices = [
            (new.slice(start, item["part_rows"]), None if typed is None else typed.slice(start, item["part_rows"]))
            for start in range(0, new.num_rows, item["part_rows"])
        ]
        written += list(pool.map(lambda rows: (write(staging=rows[0], needs=new_needs), *rows), slices))
    types = run_types(kept + [part for part, _, _ in written] + [part for part, _ in trimmed], properties, item["types"])
    schema = schema_text(properties, types)
    overwrite = schema != item["schema"]
    publish_part = functools.partial(publish, storage, item["table"], properties=properties, types=types, csv=item["csv"])
    same = typing is not None and typing[1] == types  # else the new rows are typed again
    with ThreadPoolExecutor(CPU_THREADS) as pool:
        kept = list(pool.map(publish_part, kept)) if overwrite else kept
        added = list(pool.map(lambda w: publish_part(w[0], staging=w[1], published=w[2] if same else None), written))
        added += list(pool.map(lambda t: publish_part(t[0], published=None if overwrite else t[1]), trimmed))
    if item["csv"]:
        kept = [part if "csv" in part else write_csv_twin(storage, item["table"], part) for part in kept]
    return run_result(kept, added, replaced, overwrite, types, schema)


def run_result(kept: list[dict], added: list[dict], replaced: list[dict], overwrite: bool, types: dict, schema: str, **extra) -> dict:
    """A stream's run, for ``commit_run``: its parts now, and what its Delta commit adds and removes
    (every part when the column types changed and all were published again)."""
    return {
        "parts": kept + added,
        "adds": kept + added if overwrite else added,
        "removes": [part["published"] for part in replaced],
        "overwrite": overwrite,
        "types": types,
        "schema": schema,
        **extra,
    }


def project_small_streams(
    lake: Lake, spark, plans: list[StreamPlan], formats: list[str], failures: Failures, progress, part_rows: int = PART_ROWS
) -> dict:
    items = [_work_item(plan, formats) | {"part_rows": part_rows} for plan in plans]
    work = functools.partial(project_on_executor, lake.storage)
    options = {"items_per_task": STREAMS_PER_TASK, "threads": CPU_THREADS, "sizes": [plan.bytes for plan in plans]}
    results = run_stream_items(spark, items, work, failures, progress, **options)
    return {(plan.tap_id, plan.stream): result for plan, result in zip(plans, results, strict=True) if result is not None}


# -- large streams: buckets of keys, only the touched ones rewritten ----------------------------------
def bucket_bytes(small_stream_bytes: int) -> int:
    """The stored bytes a new bucket is sized for."""
    return max(MIN_BUCKET_BYTES, small_stream_bytes // BUCKET_SHARE)


def bucket_count(data_bytes: int, small_stream_bytes: int) -> int:
    """Buckets (a power of two) of about ``bucket_bytes`` stored bytes each."""
    wanted = math.ceil(data_bytes / bucket_bytes(small_stream_bytes))
    return 1 << max(0, wanted - 1).bit_length()


@dataclass
class Layout:
    """How a large stream's run is laid out: its buckets (None: keyless), whether they are laid out
    anew, and its tasks: reading the new records, reading the previous parts (laid out anew: one
    each), writing buckets."""

    buckets: int | None
    rebucket: bool
    read_tasks: int
    part_tasks: int
    write_tasks: int

    @property
    def one_task(self) -> bool:
        """One task reads and one writes (a few updated keys): a local master runs them in this process."""
        return self.read_tasks == 1 and not self.part_tasks and self.write_tasks <= 1


def large_layout(plan: StreamPlan, small_stream_bytes: int) -> Layout:
    """The stream's buckets, laid out anew on its first large run and when they average more than
    ``BUCKET_SHARE`` times their size; tasks of about a bucket's bytes each (at most one per bucket)."""
    keyed, size = bool(plan.keys), bucket_bytes(small_stream_bytes)
    buckets = plan.state.get("buckets") if keyed else None
    rebucket = keyed and (not buckets or plan.bytes > buckets * size * BUCKET_SHARE)
    if rebucket:
        buckets = bucket_count(plan.bytes, small_stream_bytes)
    new_bytes = sum(f["entry"]["size"] for f in plan.files)
    read_tasks = max(1, min(len(plan.files), math.ceil(new_bytes / size)))
    write_tasks = min(buckets, max(1, math.ceil((plan.bytes if rebucket else new_bytes) / size))) if keyed else 0
    return Layout(buckets, rebucket, read_tasks, len(plan.state["parts"]) if rebucket else 0, write_tasks)


def _read_pieces(storage: Storage, item: dict, files: list[dict], buckets: int, batches: Iterator[Any]) -> Iterator[tuple]:
    """Executor side: the new records of the data files numbered in the input, read and typed once, cut by bucket."""
    for batch in batches:  # a read task's files: about a bucket's bytes
        chosen = [files[number] for number in batch.column("id").to_pylist()]
        yield from blocks.cut(*read_new_records(storage, item["keys"], chosen, item["needs"], item["typing"]), buckets)


def _part_pieces(storage: Storage, parts: list[dict], buckets: int, batches: Iterator[Any]) -> Iterator[tuple]:
    """Executor side (a new layout): the rows of the previous parts numbered in the input, cut by bucket."""
    for batch in batches:
        for number in batch.column("id").to_pylist():
            yield from blocks.cut(conform(read_parquet(storage, parts[number]["staging"])), None, buckets)


def _write_buckets(storage: Storage, item: dict, threads: int, groups: Iterator[tuple]) -> Iterator[Any]:
    """Executor side: each ``(bucket, rows, typed)`` becomes one new part (``bucket_part``), ``threads``
    at a time (Parquet and zstd release the GIL), holding that many buckets' rows."""
    with ThreadPoolExecutor(threads) as pool:
        running: collections.deque = collections.deque()
        for group in groups:
            running.append(pool.submit(bucket_part, storage, item, *group))
            if len(running) == threads:
                yield _part_batch(running.popleft().result())
        while running:
            yield _part_batch(running.popleft().result())


def _write_new_parts(storage: Storage, item: dict, files: list[dict], batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side, a keyless stream: the data files numbered in the input become one new part, unshuffled (every row is current)."""
    for batch in batches:
        chosen = [files[number] for number in batch.column("id").to_pylist()]
        rows, typed = read_new_records(storage, item["keys"], chosen, item["needs"], item["typing"])
        if rows.num_rows:
            yield _part_batch(bucket_part(storage, item, None, rows, typed))


def _part_batch(part: dict):
    import json

    import pyarrow as pa

    return pa.RecordBatch.from_pydict({"part": [json.dumps(part)]})


def current_typed(rows, typed, keyed: bool, activations: list[dict], hard: bool) -> tuple:
    """``(staging, typed)``: the current rows of staging ``rows`` with deletes applied, and their
    published rows taken alike from ``typed`` (None when deletes change them: they are typed anew)."""
    indices = current_indices(rows, keyed)
    current = rows if indices is None else rows.combine_chunks().take(indices)
    staging = apply_deletes(current, activations, hard)
    if typed is None or activations or staging.num_rows != current.num_rows:
        return staging, None
    return staging, typed if indices is None else typed.combine_chunks().take(indices)


def bucket_part(storage: Storage, item: dict, bucket: int | None, rows, typed=None) -> dict:
    """A bucket's new part (a keyless stream's: ``bucket`` None) from its new rows (``typed``: their
    published rows, or None) and its previous part: published at once when its values fit the
    table's column types (``item["types"]``), else left to the driver, which publishes every part again."""
    import pyarrow as pa

    keyed, properties, activations = item["keyed"], item["properties"], item["activations"]
    parts = item["previous"].get(str(bucket), [])
    if len(parts) == 1 and "published" in parts[0] and not activations:
        return update_bucket(storage, item, parts[0], conform(rows), typed) | {"bucket": bucket}
    previous = [conform(read_parquet(storage, part["staging"])) for part in parts]
    rows = pa.concat_tables([*previous, conform(rows)])
    staging, typed = current_typed(rows, None if previous else typed, keyed, activations, item["hard"])
    needs = None if activations or item["needs"] is None else join_all([item["needs"], *(part["needs"] for part in parts)])
    part = write_staging(storage, item["staging"], staging, properties, needs) | ({"bucket": bucket} if keyed else {})
    if schema_text(properties, join_all([item["types"], part["needs"]])) == item["schema"]:
        part = publish(storage, item["table"], part, properties, item["types"], item["csv"], staging, published=typed)
    return part


def update_bucket(storage: Storage, item: dict, previous: dict, rows, typed=None) -> dict:
    """A bucket's new part from its previous part and its new rows, decoding only the new ones: the
    previous rows whose keys they update are filtered out of its staging and published files alike
    (new rows come later in position order, so they go after). Published at once when the table's
    column types hold the new values; else left to the driver, which publishes every part again."""
    import pyarrow as pa
    import pyarrow.compute as pc

    properties, types = item["properties"], item["types"]
    new, typed = current_typed(rows, typed, True, [], item["hard"])
    staging = conform(read_parquet(storage, previous["staging"]))
    keep = pc.invert(pc.is_in(staging["_key"], value_set=rows["_key"]))
    new_needs = item["needs"] if item["needs"] is not None else records_needs(properties, records_of(new))
    needs = join_all([previous["needs"], new_needs])
    part = write_staging(storage, item["staging"], pa.concat_tables([staging.filter(keep), new]), properties, needs=needs)
    if schema_text(properties, join_all([types, needs])) != item["schema"]:
        return part
    kept = read_parquet(storage, f"{item['table']}/{previous['published']}").filter(keep)
    published = pa.concat_tables([kept, typed if typed is not None else typed_rows(properties, types, new)])
    return publish(storage, item["table"], part, properties, types, item["csv"], published=published)


@contextmanager
def _arrow_batch_rows(spark, rows: int):
    """Arrow batches of ``rows`` rows for the Python steps, whatever an earlier job of the session set."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, str(rows))
    try:
        yield
    finally:
        spark.conf.set(key, before)


def _run_job(spark, storage: Storage, item: dict, plan: StreamPlan, layout: Layout) -> list[dict]:
    """The run's new parts, written by Spark: keyed, each bucket's blocks brought to one task (through
    Spark's shuffle, or through block files when every executor is on this machine); keyless, unshuffled."""
    threads = 1 if layout.write_tasks > 1 else CPU_THREADS  # tasks side by side already: one bucket each in memory
    if not item["keyed"]:
        files = spark.range(len(plan.files), numPartitions=layout.read_tasks)
        return _collect_parts(spark, files.mapInArrow(functools.partial(_write_new_parts, storage, item, plan.files), "part string"))
    if runs_elsewhere(spark):
        shuffled = _blocks_frame(spark, storage, item, plan, layout, blocks.shuffle_blocks, blocks.BLOCKS)
        shuffled = shuffled.repartition(layout.write_tasks, "_bucket")  # 10 updated keys: one write task, not one per bucket
        return _collect_parts(spark, shuffled.mapInArrow(functools.partial(_write_shuffled, storage, item, threads), "part string"))
    scratch = (spark.conf.get("spark.local.dir", None) or "").split(",")[0] or None  # where Spark's shuffle files would go
    with tempfile.TemporaryDirectory(prefix="singerlake-blocks-", dir=scratch) as directory:
        refs = _blocks_frame(spark, storage, item, plan, layout, functools.partial(blocks.write_block_file, directory), blocks.BLOCK_REFS)
        with _arrow_batch_rows(spark, BLOCKS_PER_BATCH):
            tasks = blocks.spread(blocks.by_bucket([row.asDict() for row in refs.collect()]), layout.write_tasks)
        write = functools.partial(_write_filed, storage, item, threads, tasks)
        return _collect_parts(spark, spark.range(len(tasks), numPartitions=max(1, len(tasks))).mapInArrow(write, "part string"))


def _blocks_frame(spark, storage: Storage, item: dict, plan: StreamPlan, layout: Layout, send, schema: str):
    """The read tasks' pieces (new records, and a new layout's previous parts) as ``send`` gives them on (rows of ``schema``)."""
    parts, buckets = plan.state["parts"], layout.buckets
    new = functools.partial(_read_pieces, storage, item, plan.files, buckets)
    frame = spark.range(len(plan.files), numPartitions=layout.read_tasks).mapInArrow(functools.partial(_sent, send, new), schema)
    if layout.part_tasks:
        previous = functools.partial(_sent, send, functools.partial(_part_pieces, storage, parts, buckets))
        frame = frame.unionByName(spark.range(len(parts), numPartitions=layout.part_tasks).mapInArrow(previous, schema))
    return frame


def _sent(send, pieces, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: the pieces read for the input, as ``send`` gives them on."""
    return send(pieces(batches))


def _write_shuffled(storage: Storage, item: dict, threads: int, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: the new parts of the buckets among this partition's shuffled blocks."""
    return _write_buckets(storage, item, threads, blocks.shuffled_groups(batches))


def _write_filed(storage: Storage, item: dict, threads: int, tasks: list[dict], batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: the new parts of the buckets dealt to the numbered tasks, their blocks read from block files."""
    for batch in batches:
        for task in batch.column("id").to_pylist():
            yield from _write_buckets(storage, item, threads, blocks.file_groups(tasks[task]))
            blocks.release(tasks[task])


def _collect_parts(spark, frame) -> list[dict]:
    import json

    with _arrow_batch_rows(spark, BLOCKS_PER_BATCH):
        return [json.loads(row["part"]) for row in frame.collect()]


def _run_here(storage: Storage, item: dict, files: list[dict], buckets: int | None) -> list[dict]:
    """The run's new parts, when one task reads and one writes on a local master: the same two tasks,
    run in this process (no JVM started, as ``runner.run_items`` does for small streams)."""
    import json

    import pyarrow as pa

    ids = iter(pa.table({"id": pa.array(range(len(files)), pa.int64())}).to_batches(BLOCKS_PER_BATCH))
    if not item["keyed"]:
        return [json.loads(batch["part"][0].as_py()) for batch in _write_new_parts(storage, item, files, ids)]
    with tempfile.TemporaryDirectory(prefix="singerlake-blocks-") as directory:
        filed = blocks.write_block_file(directory, _read_pieces(storage, item, files, buckets, ids))
        refs = [ref for batch in filed for ref in batch.to_pylist()]
        written = _write_buckets(storage, item, CPU_THREADS, blocks.file_groups(blocks.by_bucket(refs)))
        return [json.loads(batch["part"][0].as_py()) for batch in written]


def project_large_stream(lake: Lake, spark, plan: StreamPlan, layout: Layout, formats: list[str]) -> dict:
    """A large stream in one Spark job (two on this machine's executors; one more when parts must be
    published again). Keyed: the new rows are brought together by bucket (``blocks``), and each
    touched bucket's previous part and new rows become its new part; untouched buckets stay. The
    buckets are laid out anew (every part read once) on the stream's first large run and when they
    average more than ``BUCKET_SHARE`` times their size. Keyless: the new rows are new parts."""

    storage, properties, parts, keyed = lake.storage, plan.properties, plan.state["parts"], bool(plan.keys)
    buckets, rebucket = layout.buckets, layout.rebucket
    by_bucket: dict[str, list[dict]] = {}
    for part in parts if keyed and not rebucket else []:
        by_bucket.setdefault(str(part["bucket"]), []).append(part)
    item = {
        "keyed": keyed,
        "keys": plan.keys,
        "properties": properties,
        "previous": by_bucket,
        "staging": plan.staging,
        "table": plan.table,
        "csv": "csv" in formats,
        "hard": plan.hard,
        "activations": plan.activations,
        # a rebucketed stream's buckets hold previous rows too: their parts' needs join the new files'
        "needs": None if plan.needs is None else join_all([plan.needs, *(part["needs"] for part in parts if rebucket)]),
    }
    # The types new parts are published under at once: the table's (a part needing wider ones waits
    # for the driver), or the run's own when the files' statistics give them and no part keeps
    # published rows of the table's types (a new layout, a keyless stream): so a first run too.
    item |= {"types": plan.state["types"], "schema": plan.state["schema"]}
    if item["needs"] is not None and not plan.activations and (rebucket or not keyed):
        expected = run_types([{"needs": join_all([plan.state["types"], item["needs"]])}], properties, plan.state["types"])
        item |= {"types": expected, "schema": schema_text(properties, expected)}
    typing = plan.needs is not None and not plan.activations  # the new records are typed as they are read
    item["typing"] = (table_properties(properties, item["types"]), item["types"]) if typing else None
    if runs_here(spark, layout.one_task):
        written = _run_here(storage, item, plan.files, buckets)
    else:
        written = _run_job(session_of(spark), storage, item, plan, layout)
    touched = {part.get("bucket") for part in written}
    replaced = list(parts) if rebucket else [part for part in parts if keyed and part.get("bucket") in touched]
    gone = {part["staging"] for part in replaced}
    kept = [part for part in parts if part["staging"] not in gone]
    if plan.activations and kept:  # a refresh: the other buckets' rows of older table versions may be gone
        context = {"activations": plan.activations, "hard": plan.hard, "staging": plan.staging, "properties": properties}
        for result in run_items(spark, [{**context, "part": part} for part in kept], functools.partial(part_deletes, storage)):
            if "replaced" in result:
                replaced.append(result["replaced"])
                written += [result["part"]] if result["part"] else []
        gone = {part["staging"] for part in replaced}
        kept = [part for part in parts if part["staging"] not in gone]
    types = run_types(kept + written, properties, plan.state["types"])
    schema = schema_text(properties, types)
    overwrite = schema != plan.state["schema"]  # then every part is published again, under the new types
    work = functools.partial(publish, storage, plan.table, properties=properties, types=types, csv="csv" in formats)
    again = (kept if overwrite else []) + [part for part in written if "published" not in part or schema != item["schema"]]
    done = dict(zip([part["staging"] for part in again], run_items(spark, again, work, items_per_task=2, threads=2), strict=True))
    if "csv" in formats and not overwrite:  # CSV asked for the first time: twins of the kept files
        twins = [part for part in kept if "csv" not in part]
        made = run_items(spark, twins, functools.partial(write_csv_twin, storage, plan.table))
        done |= dict(zip([part["staging"] for part in twins], made, strict=True))
    kept, added = [done.get(part["staging"], part) for part in kept], [done.get(part["staging"], part) for part in written]
    return run_result(kept, added, replaced, overwrite, types, schema, **({"buckets": buckets} if keyed else {}))


# -- the job ---------------------------------------------------------------------------------------
def commit_run(lake: Lake, plan: StreamPlan, result: dict) -> dict:
    """The run's one Delta commit: the last step, so a crash or a failed stream leaves the previous version current."""
    state = {"position": plan.end.to_bookmark(), "types": result["types"], "schema": result["schema"], "parts": result["parts"]}
    state |= {"deletes": plan.deletes, "activations": plan.activated}
    if "buckets" in result:  # a large stream's parts are buckets of keys (SPEC.md §12)
        state["buckets"] = result["buckets"]
    adds = [{"path": part["published"], "size": part["size"], "rows": part["rows"]} for part in result["adds"]]
    schema = table_schema(table_properties(plan.properties, result["types"]), result["types"])
    pause_point("project-before-commit")
    version = delta.commit(lake.storage, plan.table, plan.published, schema, adds, result["removes"], result["overwrite"], state)
    plan.published = delta.Published(version, state, state_version=version)
    return plan.summary(plan.new_records)


def check_formats(lake: Lake, formats: list[str], iceberg_catalog: str | None = None):
    """ConfigError for an unknown format or Iceberg without a catalog that opens; the Iceberg catalog (or None)."""
    unknown = set(formats) - set(FORMATS) - {"parquet"}
    if unknown:
        raise ConfigError(f"unknown published formats {sorted(unknown)}; use delta, csv and/or iceberg")
    if "iceberg" not in formats:
        return None
    if not iceberg_catalog:
        raise ConfigError("--formats iceberg needs --iceberg-catalog NAME (a pyiceberg catalog)")
    return iceberg.open_catalog(iceberg_catalog, lake.storage)


def sync_iceberg(lake: Lake, catalog, plan: StreamPlan) -> int | None:
    """The stream's Iceberg table made the Delta table's latest version, in one snapshot (SPEC.md §12)."""
    schema = table_schema(table_properties(plan.properties, plan.state["types"]), plan.state["types"])
    return iceberg.sync(lake.storage, catalog, plan.tap_id, plan.stream, plan.published, schema)


def project(
    lake: Lake,
    spark,
    tap_id: str | None = None,
    stream: str | None = None,
    formats: list[str] | None = None,
    small_stream_bytes: int = SMALL_STREAM_BYTES,
    part_rows: int = PART_ROWS,
    progress: Progress | None = None,
    failures: list[StreamFailure] | None = None,
    hard_delete: bool = False,
    iceberg_catalog: str | None = None,
) -> list[dict]:
    """Project the selected streams. A stream that fails is added to ``failures`` (its table stays at
    its last version) and the others are projected; without ``failures``, StreamsFailed is raised at the end.
    Deleted rows (``_sdc_deleted_at``, ACTIVATE_VERSION) stay with ``_sdc_deleted_at`` set, or with
    ``hard_delete`` are left out (SPEC.md §12). With ``iceberg`` among the formats, each table is also
    an Iceberg table in the pyiceberg catalog ``iceberg_catalog``. ``spark`` may be an ``OnDemand``
    session: small streams that fit one task then run in this process on a local master, and Spark
    starts only for more."""
    lake.check_exists()
    formats = ["delta" if fmt == "parquet" else fmt for fmt in (formats or ["delta"])]
    catalog = check_formats(lake, formats, iceberg_catalog)
    found = Failures()
    plans = for_each_stream(selected_streams(lake, tap_id, stream), lambda tap, name: plan_stream(lake, tap, name, hard_delete), found)
    pending = [plan for plan in plans.values() if not plan.up_to_date]
    is_large = lambda plan: plan.bytes > small_stream_bytes or "buckets" in plan.state  # noqa: E731  (bucketed: stays large)
    small = [plan for plan in pending if not is_large(plan)]
    written = project_small_streams(lake, spark, small, formats, found, progress, part_rows)
    large = {(plan.tap_id, plan.stream): (plan, large_layout(plan, small_stream_bytes)) for plan in pending if is_large(plan)}
    if any(not layout.one_task for _, layout in large.values()):
        spark = session_of(spark)  # started here: a failed start is the run's error, not a stream's
    run_large = lambda tap, name: project_large_stream(lake, spark, *large[(tap, name)], formats)  # noqa: E731
    written |= for_each_stream(list(large), run_large, found, 1)
    committed = for_each_stream(list(written), lambda tap, name: commit_run(lake, plans[(tap, name)], written[(tap, name)]), found)
    if catalog is not None:  # after the Delta commits; also streams with nothing new whose Iceberg table lags behind
        mirror = [stream_id for stream_id, plan in plans.items() if not found.has(*stream_id) and plan.published.version is not None]
        for tap in sorted({tap for tap, _ in mirror}):  # once, before the streams' threads
            iceberg.ensure_namespace(catalog, tap)
        snapshots = for_each_stream(mirror, lambda tap, name: sync_iceberg(lake, catalog, plans[(tap, name)]), found)
        for stream_id, snapshot in snapshots.items():
            if stream_id in committed:
                committed[stream_id]["iceberg_snapshot"] = snapshot
    results = [committed.get(stream_id) or plan.summary() for stream_id, plan in plans.items() if not found.has(*stream_id)]
    found.deliver(failures)
    return results
