"""Large partitioned streams starting their table (SPEC.md §12). On this machine's executors the rows cross
one exchange, by partition: the read tasks cut them by partition and file their keys and positions by key
bucket; the key tasks find the rows a later row of their key supersedes; each write task leaves those out
of its partitions' rows and writes parts of one partition each, as the one-task path (``small``) would.
Executors elsewhere exchange through Spark's shuffle twice: by key bucket (current rows, cut by
partition), then by partition."""

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
from singerlake.tables.staging import current_indices, read_new_records

# The most block bytes (uncompressed Arrow: rows and typed rows) one write task holds of a partition:
# a larger partition goes to several tasks, each writing its own parts of it.
PARTITION_TASK_BYTES = 256 << 20
# The stored bytes of new records one read task takes: it cuts them by partition, so fewer, larger read
# tasks hand on fewer, larger blocks (a block per partition each).
READ_TASK_BYTES = 16 << 20
# The stored bytes of new records whose keys and positions one key task takes (its key bucket).
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
    """Executors of this machine, through block files: one exchange of the rows, by partition. The read tasks
    cut their rows by partition and file each row's key and position by key bucket beside them; the key
    tasks find the rows a later row of their key supersedes, in whatever partition; each write task leaves
    those out of its partitions' rows and writes their parts."""
    scratch = (spark.conf.get("spark.local.dir", None) or "").split(",")[0] or None
    with tempfile.TemporaryDirectory(prefix="singerlake-blocks-", dir=scratch) as directory:
        new_bytes = sum(file["entry"]["size"] for file in plan.files)
        read_tasks = max(1, min(len(plan.files), math.ceil(new_bytes / READ_TASK_BYTES)))
        key_buckets = 1 << max(0, math.ceil(new_bytes / KEY_TASK_BYTES) - 1).bit_length()
        read = functools.partial(_read_filed, storage, item, plan.files, key_buckets, directory)
        filed = collected_refs(spark, spark.range(len(plan.files), numPartitions=read_tasks).mapInArrow(read, blocks.BLOCK_REFS))
        by_key = blocks.filed_tasks(directory, [{bucket: refs} for bucket, refs in filed.items() if bucket < 0])
        find = functools.partial(_superseded_filed, directory, by_key)
        superseded = collected_refs(spark, spark.range(len(by_key), numPartitions=max(1, len(by_key))).mapInArrow(find, blocks.BLOCK_REFS))
        groups = _split_large({number: refs for number, refs in filed.items() if number >= 0}, PARTITION_TASK_BYTES)
        given = blocks.spread(groups, layout.write_tasks)
        numbers = [{refs[0]["_bucket"] for refs in task.values()} for task in given]
        tasks = blocks.filed_tasks(
            directory, [(task, {n: superseded[n] for n in ns if n in superseded}) for task, ns in zip(given, numbers, strict=True)]
        )
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


POSITION = ["_singerlake_commit", "_singerlake_index"]
KEY_COLUMNS = ["_key", "_singerlake_commit", "_singerlake_time", "_singerlake_index"]  # what tells a key's current row
NUMBER = "_partition_number"  # a key row's partition number (``partition_id``)


def _read_filed(storage: Storage, item: dict, files: list[dict], key_buckets: int, directory: str, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: the new records of the numbered data files, read and typed once, filed by partition
    number; their keys and positions (``KEY_COLUMNS``, ``NUMBER``) filed by key bucket, numbered below 0."""
    import pyarrow as pa

    for batch in batches:
        chosen = [files[number] for number in batch.column("id").to_pylist()]
        rows, typed = read_new_records(storage, item["keys"], chosen, item["needs"], item["typing"])
        pieces, keys = [], []
        for partition, held, held_typed in partitions.split(rows, typed, item["partitioning"], item["kinds"]):
            text = json_text(partition)
            number = partition_id(text)
            pieces.append((number, held.append_column(PARTITION, pa.repeat(pa.scalar(text), held.num_rows)), held_typed))
            keys.append(held.select(KEY_COLUMNS).append_column(NUMBER, pa.repeat(pa.scalar(number, pa.int64()), held.num_rows)))
        del rows, typed  # the pieces are slices of one copy, cut by partition
        yield from blocks.write_block_file(directory, pieces)
        if keys:
            cut = blocks.cut(pa.concat_tables(keys), None, key_buckets)
            yield from blocks.write_block_file(directory, ((-1 - bucket, held, None) for bucket, held, _ in cut))


def superseded_rows(keys):
    """The rows of ``keys`` (``KEY_COLUMNS``) that a later row of their key supersedes (``current_indices``); None when no key repeats."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(pc.unique(keys["_key"])) == keys.num_rows:
        return None
    gone = np.ones(keys.num_rows, dtype=bool)
    gone[current_indices(keys, True).to_numpy()] = False
    return keys.filter(pa.array(gone))


def _superseded_filed(directory: str, tasks: list[str], batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: of the key buckets dealt to the numbered tasks, the positions of the superseded rows, filed by partition number."""
    for batch in batches:
        for task in batch.column("id").to_pylist():
            refs = blocks.task_refs(tasks[task])
            for _, keys, _ in blocks.file_groups(refs):
                gone = superseded_rows(keys)
                if gone is not None:
                    by_number = partitions.grouped(gone, None, gone[NUMBER])
                    yield from blocks.write_block_file(
                        directory, ((rows[NUMBER][0].as_py(), rows.select(POSITION), None) for _, rows, _ in by_number)
                    )
            blocks.release(refs)


def _write_filed(storage: Storage, item: dict, tasks: list[str], batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: the partitions dealt to the numbered tasks (``blocks.filed_tasks``), superseded rows left out, as parts."""
    for batch in batches:
        for task in batch.column("id").to_pylist():
            given, superseded = blocks.task_refs(tasks[task])
            yield from write_partitions(storage, item, _current_groups(item, given, superseded))
            blocks.release(given)


def _current_groups(item: dict, given: dict[int, list[dict]], superseded: dict[int, list[dict]]) -> Iterator[tuple]:
    """``(number, rows, typed)`` of each group of blocks ``given`` names: the rows no later row of their key supersedes, deletes applied."""
    for number, rows, typed in blocks.file_groups(given):
        gone = superseded.get(given[number][0]["_bucket"])
        if gone:
            positions = [held for _, held, _ in blocks.file_groups({0: gone})][0]
            rows, typed = without(rows, typed, positions)
        rows, typed = current_typed(rows, typed, True, item["activations"], item["hard"])
        if rows.num_rows:  # else each of its keys moved to another partition, or was deleted (hard)
            yield number, rows, typed


def without(rows, typed, positions) -> tuple:
    """``rows`` (and ``typed``, or None) but those at ``positions`` (``POSITION``), in their order."""
    import numpy as np
    import pyarrow as pa

    place = pa.table({"c": rows["_singerlake_commit"], "i": rows["_singerlake_index"], "row": np.arange(rows.num_rows)})
    kept = place.join(positions.rename_columns(["c", "i"]), keys=["c", "i"], join_type="left anti")["row"].to_numpy()
    kept = pa.array(np.sort(kept))
    return rows.take(kept), None if typed is None else typed.take(kept)


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
