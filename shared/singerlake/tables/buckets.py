"""Large streams: parts are buckets of keys (``crc32(_key) mod buckets``); a run rewrites only the
buckets its new records touch, each by one executor (its previous part and its new rows), in a
Spark job of the stream's own."""

from __future__ import annotations

import collections
import functools
import math
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from singerlake.format.exact import join_all, records_needs
from singerlake.lake import Lake
from singerlake.spark.executors import runs_elsewhere
from singerlake.spark.runner import (
    run_items,
)
from singerlake.spark.session import runs_here, session_of
from singerlake.storage import Storage
from singerlake.tables import blocks
from singerlake.tables.blocks import BLOCKS_PER_BATCH
from singerlake.tables.deletes import apply_deletes, run_types, table_properties
from singerlake.tables.overrides import apply, staging_position
from singerlake.tables.parts import part_deletes, publish, read_parquet, records_of, typed_rows, write_csv_twin, write_staging
from singerlake.tables.plan import StreamPlan, run_result, schema_text
from singerlake.tables.staging import CPU_THREADS, conform, current_indices, read_new_records

# A large stream's buckets start at a sixteenth of the small-stream size (small enough that an update
# rewrites little, and a write task holds little); when they average more than the whole size the
# stream is re-bucketed, so one bucket never costs an executor more than a small stream.
BUCKET_SHARE = 16


MIN_BUCKET_BYTES = 1 << 10


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
    if schema_text(properties, join_all([item["types"], part["needs"]]), item["overrides"]) == item["schema"]:
        part = publish(storage, item["table"], part, properties, item["types"], item["csv"], staging, typed, item["overrides"])
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
    if schema_text(properties, join_all([types, needs]), item["overrides"]) != item["schema"]:
        return part
    kept = read_parquet(storage, f"{item['table']}/{previous['published']}").filter(keep)
    typed = typed if typed is not None else typed_rows(properties, types, new)
    published = pa.concat_tables([kept, apply(typed, item["overrides"], staging_position(lambda: new))])
    return publish(storage, item["table"], part, properties, types, item["csv"], published=published)


@contextmanager
def arrow_batch_rows(spark, rows: int):
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
        return collect_parts(spark, files.mapInArrow(functools.partial(_write_new_parts, storage, item, plan.files), "part string"))
    if runs_elsewhere(spark):
        shuffled = blocks_frame(spark, storage, item, plan, layout, blocks.shuffle_blocks, blocks.BLOCKS)
        shuffled = shuffled.repartition(layout.write_tasks, "_bucket")  # 10 updated keys: one write task, not one per bucket
        return collect_parts(spark, shuffled.mapInArrow(functools.partial(_write_shuffled, storage, item, threads), "part string"))
    scratch = (spark.conf.get("spark.local.dir", None) or "").split(",")[0] or None  # where Spark's shuffle files would go
    with tempfile.TemporaryDirectory(prefix="singerlake-blocks-", dir=scratch) as directory:
        refs = blocks_frame(spark, storage, item, plan, layout, functools.partial(blocks.write_block_file, directory), blocks.BLOCK_REFS)
        tasks = blocks.filed_tasks(directory, blocks.spread(collected_refs(spark, refs), layout.write_tasks))
        write = functools.partial(_write_filed, storage, item, threads, tasks)
        return collect_parts(spark, spark.range(len(tasks), numPartitions=max(1, len(tasks))).mapInArrow(write, "part string"))


def blocks_frame(spark, storage: Storage, item: dict, plan: StreamPlan, layout: Layout, send, schema: str):
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


def _write_filed(storage: Storage, item: dict, threads: int, tasks: list[str], batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: the new parts of the buckets dealt to the numbered tasks (``blocks.filed_tasks``), read from block files."""
    for batch in batches:
        for task in batch.column("id").to_pylist():
            refs = blocks.task_refs(tasks[task])
            yield from _write_buckets(storage, item, threads, blocks.file_groups(refs))
            blocks.release(refs)


def collected_refs(spark, refs) -> dict[int, list[dict]]:
    """The rows of a frame of ``BLOCK_REFS``, by bucket."""
    with arrow_batch_rows(spark, BLOCKS_PER_BATCH):
        return blocks.by_bucket([row.asDict() for row in refs.collect()])


def collect_parts(spark, frame) -> list[dict]:
    import json

    with arrow_batch_rows(spark, BLOCKS_PER_BATCH):
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


def large_item(plan: StreamPlan, formats: list[str], rebucket: bool) -> dict:
    """What a large stream's tasks need to write its parts (``rebucket``: every previous part is read into new ones)."""
    properties, parts, keyed = plan.properties, plan.state["parts"], bool(plan.keys)
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
        "overrides": plan.overrides,
        "hard": plan.hard,
        "activations": plan.activations,
        # a rebucketed stream's buckets hold previous rows too: their parts' needs join the new files'
        "needs": None if plan.needs is None else join_all([plan.needs, *(part["needs"] for part in parts if rebucket)]),
        "partitioning": plan.partitioning,
    }
    # The types new parts are published under at once: the table's (a part needing wider ones waits
    # for the driver), or the run's own when the files' statistics give them and no part keeps
    # published rows of the table's types (a new layout, a keyless stream): so a first run too.
    item |= {"types": plan.state["types"], "schema": plan.state["schema"]}
    if item["needs"] is not None and not plan.activations and (rebucket or not keyed):
        expected = run_types([{"needs": join_all([plan.state["types"], item["needs"]])}], properties, plan.state["types"])
        item |= {"types": expected, "schema": schema_text(properties, expected, plan.overrides)}
    typing = plan.needs is not None and not plan.activations  # the new records are typed as they are read
    item["typing"] = (table_properties(properties, item["types"]), item["types"]) if typing else None
    return item


def project_large_stream(lake: Lake, spark, plan: StreamPlan, layout: Layout, formats: list[str]) -> dict:
    """A large stream in one Spark job (two on this machine's executors; one more when parts must be
    published again). Keyed: the new rows are brought together by bucket (``blocks``), and each
    touched bucket's previous part and new rows become its new part; untouched buckets stay. The
    buckets are laid out anew (every part read once) on the stream's first large run and when they
    average more than ``BUCKET_SHARE`` times their size. Keyless: the new rows are new parts."""

    storage, properties, parts, keyed = lake.storage, plan.properties, plan.state["parts"], bool(plan.keys)
    buckets, rebucket = layout.buckets, layout.rebucket
    item = large_item(plan, formats, rebucket)
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
    return finish(lake, spark, plan, formats, item, kept, written, replaced, **({"buckets": buckets} if keyed else {}))


def finish(lake: Lake, spark, plan: StreamPlan, formats: list[str], item: dict, kept: list, written: list, replaced: list, **extra) -> dict:
    """The run's result once its tasks wrote their parts: the parts published again (every part when
    the column types changed; new ones the tasks could not publish under the types they had), CSV
    twins asked for the first time, and what the commit adds and removes."""
    storage, properties = lake.storage, plan.properties
    types = run_types(kept + written, properties, plan.state["types"])
    schema = schema_text(properties, types, plan.overrides)
    overwrite = schema != plan.state["schema"]  # then every part is published again, under the new types
    csv = "csv" in formats
    work = functools.partial(
        publish, storage, plan.table, properties=properties, types=types, csv=csv, overrides=plan.overrides, partitioning=plan.partitioning
    )
    again = (kept if overwrite else []) + [part for part in written if "published" not in part or schema != item["schema"]]
    done = dict(zip([part["staging"] for part in again], run_items(spark, again, work, items_per_task=2, threads=2), strict=True))
    if "csv" in formats and not overwrite:  # CSV asked for the first time: twins of the kept files
        twins = [part for part in kept if "csv" not in part]
        made = run_items(spark, twins, functools.partial(write_csv_twin, storage, plan.table))
        done |= dict(zip([part["staging"] for part in twins], made, strict=True))
    kept, added = [done.get(part["staging"], part) for part in kept], [done.get(part["staging"], part) for part in written]
    return run_result(kept, added, replaced, overwrite, types, schema, **extra)
