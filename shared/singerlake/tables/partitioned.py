"""Large partitioned streams starting their table (SPEC.md §12): a large stream's job with one exchange
more. The read tasks cut the new rows by key bucket (``blocks``); each bucket's task keeps the current
row per key and cuts those rows by partition; each partition's rows are brought to a write task,
which writes them as parts of one partition each, as the one-task path (``small``) would."""

from __future__ import annotations

import functools
import math
import tempfile
import zlib
from collections.abc import Iterator
from typing import Any

from singerlake.format.exact import join_all, json_text
from singerlake.lake import Lake
from singerlake.spark.executors import runs_elsewhere
from singerlake.spark.session import session_of
from singerlake.storage import Storage
from singerlake.tables import blocks, partitions
from singerlake.tables.buckets import Layout, blocks_frame, collect_parts, collected_refs, current_typed, finish, large_item
from singerlake.tables.parts import publish, write_staging
from singerlake.tables.plan import StreamPlan, schema_text

# The most block bytes (uncompressed Arrow: rows and typed rows) one write task holds of a partition:
# a larger partition goes to several tasks, each writing its own parts of it.
PARTITION_TASK_BYTES = 256 << 20
# The most block bytes a task cutting key buckets by partition takes: it holds their current rows and
# cuts them once (three copies at its peak), so the blocks it hands on are few.
KEY_TASK_BYTES = 64 << 20


def starts_table(plan: StreamPlan) -> bool:
    """Whether the run starts a keyed partitioned stream's table (its first run, or a rebuild): the runs this path takes."""
    return bool(plan.partitioning and plan.keys and not plan.state["parts"])


def project_partitioned_stream(lake: Lake, spark, plan: StreamPlan, layout: Layout, formats: list[str], part_rows: int) -> dict:
    """The stream's first parts, written by Spark tasks: by key bucket, then by partition (module docstring)."""
    kinds = partitions.field_kinds(plan.partitioning, plan.properties)
    item = large_item(plan, formats, rebucket=True) | {"kinds": kinds, "part_rows": part_rows}
    session = session_of(spark)
    if runs_elsewhere(session):
        written = _shuffled_job(session, lake.storage, item, plan, layout)
    else:
        written = _filed_job(session, lake.storage, item, plan, layout)
    return finish(lake, spark, plan, formats, item, [], written, [])


def partition_id(text: str) -> int:
    """A partition's number in the exchange, of its JSON text (two partitions of one number: told apart by ``PARTITION``)."""
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


PARTITION = "_partition"  # a column of the rows on their way to their partition's task: the partition's JSON text


def current_by_partition(item: dict, groups: Iterator[tuple]) -> Iterator[tuple[int, Any, Any]]:
    """Executor side: the current rows (deletes applied) of the key buckets ``groups`` gives, cut by partition
    once for them all, as ``(partition number, rows, typed)``, the rows carrying their partition (``PARTITION``):
    a task holding many buckets hands on one block per partition, not one per bucket and partition."""
    import pyarrow as pa

    current = [current_typed(rows, typed, True, item["activations"], item["hard"]) for _, rows, typed in groups]
    current = [(rows, typed) for rows, typed in current if rows.num_rows]
    if not current:
        return
    typed = [typed for _, typed in current]
    rows, typed = pa.concat_tables([rows for rows, _ in current]), None if None in typed else pa.concat_tables(typed)
    current.clear()
    pieces = partitions.split(rows, typed, item["partitioning"], item["kinds"])
    del rows, typed  # the pieces are slices of one copy, cut by partition: the rows they came from go now
    for partition, held, held_typed in pieces:
        text = json_text(partition)
        yield partition_id(text), held.append_column(PARTITION, pa.repeat(pa.scalar(text), held.num_rows)), held_typed


def write_partitions(storage: Storage, item: dict, groups: Iterator[tuple]) -> Iterator[Any]:
    """Executor side: each partition's rows (one key each) as parts of at most ``part_rows`` rows, published
    at once when their values fit the run's column types (else by the driver, ``buckets.finish``)."""
    import json

    import pyarrow as pa

    properties, needs = item["properties"], None if item["activations"] else item["needs"]
    for _, group, group_typed in groups:
        for partition, rows, typed in by_partition(group, group_typed):
            for start in range(0, rows.num_rows, item["part_rows"]):
                staging, piece = rows.slice(start, item["part_rows"]), None if typed is None else typed.slice(start, item["part_rows"])
                part = write_staging(storage, item["staging"], staging, properties, needs) | {"partition": partition}
                if schema_text(properties, join_all([item["types"], part["needs"]]), item["overrides"]) == item["schema"]:
                    part = publish(
                        storage, item["table"], part, properties, item["types"], item["csv"], staging, piece, item["overrides"],
                        item["partitioning"],
                    )  # fmt: skip
                yield pa.RecordBatch.from_pydict({"part": [json.dumps(part)]})


def by_partition(rows, typed) -> list[tuple[dict, Any, Any]]:
    """``(partition, rows, typed)`` of each partition among rows carrying theirs (``PARTITION``, dropped)."""
    import json

    texts = rows[PARTITION]
    return [
        (json.loads(texts[first].as_py()), held, held_typed)
        for first, held, held_typed in partitions.grouped(rows.drop_columns([PARTITION]), typed, texts)
    ]


def _filed_job(spark, storage: Storage, item: dict, plan: StreamPlan, layout: Layout) -> list[dict]:
    """Executors of this machine: both exchanges through block files. The key buckets go to as few tasks as
    hold ``KEY_TASK_BYTES`` each (each hands on a block per partition); the partitions to write tasks."""
    scratch = (spark.conf.get("spark.local.dir", None) or "").split(",")[0] or None
    with tempfile.TemporaryDirectory(prefix="singerlake-blocks-", dir=scratch) as directory:
        to_files = functools.partial(blocks.write_block_file, directory)
        refs = blocks_frame(spark, storage, item, plan, layout, to_files, blocks.BLOCK_REFS)
        by_key = collected_refs(spark, refs)
        cut_tasks = min(layout.write_tasks, math.ceil(sum(map(blocks.block_bytes, by_key.values())) / KEY_TASK_BYTES))
        by_key_tasks = blocks.filed_tasks(directory, blocks.spread(by_key, max(1, cut_tasks)))
        cut = functools.partial(_cut_filed, item, directory, by_key_tasks)
        refiled = spark.range(len(by_key_tasks), numPartitions=max(1, len(by_key_tasks))).mapInArrow(cut, blocks.BLOCK_REFS)
        by_partition = _split_large(collected_refs(spark, refiled), PARTITION_TASK_BYTES)
        tasks = blocks.filed_tasks(directory, blocks.spread(by_partition, layout.write_tasks))
        write = functools.partial(_write_filed, storage, item, tasks)
        return collect_parts(spark, spark.range(len(tasks), numPartitions=max(1, len(tasks))).mapInArrow(write, "part string"))


def _split_large(grouped: dict[int, list[dict]], most_bytes: int) -> dict[int, list[dict]]:
    """Each number's blocks in groups of at most ``most_bytes`` (a block larger than that alone), numbered anew."""
    split: dict[int, list[dict]] = {}
    for refs in grouped.values():
        held, size = [], 0
        for ref in refs:
            if held and size + ref["rows"] + ref["typed"] > most_bytes:
                split[len(split)] = held
                held, size = [], 0
            held.append(ref)
            size += ref["rows"] + ref["typed"]
        split[len(split)] = held
    return split


def _cut_filed(item: dict, directory: str, tasks: list[str], batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: the key buckets dealt to the numbered tasks (``blocks.filed_tasks``), their current rows filed again by partition."""
    for batch in batches:
        for task in batch.column("id").to_pylist():
            refs = blocks.task_refs(tasks[task])
            yield from blocks.write_block_file(directory, current_by_partition(item, blocks.file_groups(refs)))
            blocks.release(refs)


def _write_filed(storage: Storage, item: dict, tasks: list[str], batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: the partitions dealt to the numbered tasks (``blocks.filed_tasks``), written as parts."""
    for batch in batches:
        for task in batch.column("id").to_pylist():
            refs = blocks.task_refs(tasks[task])
            yield from write_partitions(storage, item, blocks.file_groups(refs))
            blocks.release(refs)


def _shuffled_job(spark, storage: Storage, item: dict, plan: StreamPlan, layout: Layout) -> list[dict]:
    """Executors that may be other machines: both exchanges through Spark's shuffle (a partition's rows to one task)."""
    shuffled = blocks_frame(spark, storage, item, plan, layout, blocks.shuffle_blocks, blocks.BLOCKS)
    by_key = shuffled.repartition(layout.write_tasks, "_bucket").mapInArrow(functools.partial(_cut_shuffled, item), blocks.BLOCKS)
    to_partitions = by_key.repartition(layout.write_tasks, "_bucket")
    return collect_parts(spark, to_partitions.mapInArrow(functools.partial(_write_shuffled, storage, item), "part string"))


def _cut_shuffled(item: dict, batches: Iterator[Any]) -> Iterator[Any]:
    return blocks.shuffle_blocks(current_by_partition(item, blocks.shuffled_groups(batches)))


def _write_shuffled(storage: Storage, item: dict, batches: Iterator[Any]) -> Iterator[Any]:
    return write_partitions(storage, item, blocks.shuffled_groups(batches))
