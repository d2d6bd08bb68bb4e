"""Small streams: one work item each, all in ONE Spark job, with pyarrow on the executor; their new
rows form parts of at most ``PART_ROWS`` rows, and a previous part holding an updated key is rewritten."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

from singerlake.format.exact import join_all, json_text, records_needs
from singerlake.lake import Lake
from singerlake.spark.runner import (
    Failures,
    run_stream_items,
)
from singerlake.storage import Storage
from singerlake.tables import partitions
from singerlake.tables.deletes import apply_deletes, deletes_changed, run_types, table_properties
from singerlake.tables.parts import may_hold, publish, read_parquet, records_of, trim_part, write_csv_twin, write_staging
from singerlake.tables.plan import StreamPlan, run_result, schema_text, work_item
from singerlake.tables.staging import CPU_THREADS, conform, current_indices, read_new_records

STREAMS_PER_TASK = 16


PART_ROWS = 1 << 18  # a small stream's new rows are parts of at most this many: an update rewrites the parts holding its keys
OPEN_PART_BYTES = 2 << 20  # a last part under this many stored bytes takes the next run's new rows: a bounded rewrite


# -- small streams: one work item each, all in one Spark job ---------------------------------------
def open_tail(parts: list[dict], part_rows: int) -> dict | None:
    """The stream's last part while it is small (SPEC.md §12): a run's new rows join it, so a stream
    projected after every small landing keeps a bounded number of parts."""
    tail = parts[-1] if parts else None
    if tail is None or "bucket" in tail or tail.get("bytes", OPEN_PART_BYTES) >= OPEN_PART_BYTES or tail["rows"] >= part_rows:
        return None
    return tail


def join_tail(storage: Storage, item: dict, tail: dict, updated, new, typed, typing):
    """``(rows, typed, needs)``: the tail part's rows whose keys no new record updates, then the new rows
    (both in position order); their published rows when the tail's are typed as the new ones are
    (else None); and the tail's needs joined with the new rows' (None: found from the new rows' records)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    staging = conform(read_parquet(storage, tail["staging"]))
    keep = pc.invert(pc.is_in(staging["_key"], value_set=updated)) if len(updated) else None
    rows = staging if keep is None else staging.filter(keep)
    if typed is not None and typing[1] == item["types"] and not item["overrides"]:  # typed alike: no row decoded again
        published = partitions.without_columns(read_parquet(storage, f"{item['table']}/{tail['published']}"), item["partitioning"])
        typed = pa.concat_tables([published if keep is None else published.filter(keep), typed.cast(published.schema)])
    else:
        typed = None
    new_needs = item["needs"] if item["needs"] is not None else records_needs(item["properties"], records_of(new))
    return pa.concat_tables([rows, new]), typed, join_all([tail["needs"], new_needs])


def project_on_executor(storage: Storage, item: dict) -> dict:
    """Executor side: project one small stream: rewrite the parts a new record updates (only those whose
    key range may hold one are read), add the new current rows to the open tail part or as a new part,
    publish what changed (everything when the column types changed). A partitioned stream's new rows
    go to their partitions, each joining its partition's open tail."""
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
    groups = by_partition(item, new, typed)
    tails = {} if activations or not new.num_rows else open_tails(item["parts"], [group[0] for group in groups], item["part_rows"])
    tailed = {tail["staging"] for tail in tails.values()}
    kept, replaced, fresh, trimmed = [], [], [], []
    for part in item["parts"]:
        if part["staging"] in tailed:
            continue
        holds = len(updated) and may_hold(part, updated)
        if holds and pc.any(pc.is_in(read_parquet(storage, part["staging"], ["_key"])["_key"], value_set=updated)).as_py():
            staging = conform(read_parquet(storage, part["staging"]))
            replaced.append(part)
            keep = pc.invert(pc.is_in(staging["_key"], value_set=updated))
            if activations or not pc.any(keep).as_py():  # deletes change published values: typed anew
                fresh.append((apply_deletes(staging.filter(keep), activations, hard), part.get("partition")))
            else:
                trimmed.append(trim_part(storage, item, part, staging, keep))
        elif activations:  # a refresh: rows of older table versions may be gone
            staging = conform(read_parquet(storage, part["staging"]))
            rows = apply_deletes(staging, activations, hard)
            if deletes_changed(staging, rows):
                replaced.append(part)
                fresh.append((rows, part.get("partition")))
            else:
                kept.append(part)
        else:
            kept.append(part)
    pieces = []  # (staging rows, typed rows or None, needs or None, partition) of the run's new parts
    for partition, new, typed in groups:
        new = apply_deletes(new, activations, hard)
        if typed is not None and typed.num_rows != new.num_rows:  # hard deletes left rows out: typed again
            typed = None
        new_needs = None if activations else item["needs"]  # the files' statistics: not the deletion times activations add
        tail = tails.get(partition_key(partition))
        if tail is not None:
            replaced.append(tail)
            new, typed, new_needs = join_tail(storage, item, tail, updated, new, typed, typing)
        for start in range(0, new.num_rows, item["part_rows"]):
            piece = typed if typed is None else typed.slice(start, item["part_rows"])
            pieces.append((new.slice(start, item["part_rows"]), piece, new_needs, partition))
    write = functools.partial(write_staging, storage, item["staging"], properties=properties)
    placed = lambda part, partition: part | ({"partition": partition} if partition is not None else {})  # noqa: E731
    with ThreadPoolExecutor(CPU_THREADS) as pool:  # Parquet and zstd release the GIL
        fresh = [(rows, partition) for rows, partition in fresh if rows.num_rows]
        written = list(pool.map(lambda f: (placed(write(staging=f[0], needs=None), f[1]), f[0], None), fresh))
        written += list(pool.map(lambda p: (placed(write(staging=p[0], needs=p[2]), p[3]), p[0], p[1]), pieces))
    types = run_types(kept + [part for part, _, _ in written] + [part for part, _ in trimmed], properties, item["types"])
    schema = schema_text(properties, types, item["overrides"])
    overwrite = schema != item["schema"]
    publish_part = functools.partial(
        publish, storage, item["table"], properties=properties, types=types, csv=item["csv"], overrides=item["overrides"],
        partitioning=item["partitioning"],
    )  # fmt: skip
    same = typing is not None and typing[1] == types  # else the new rows are typed again
    with ThreadPoolExecutor(CPU_THREADS) as pool:
        kept = list(pool.map(publish_part, kept)) if overwrite else kept
        added = list(pool.map(lambda t: publish_part(t[0], published=None if overwrite else t[1]), trimmed))
        # the newest rows last: the open tail
        added += list(pool.map(lambda w: publish_part(w[0], staging=w[1], published=w[2] if same else None), written))
    if item["csv"]:
        kept = [part if "csv" in part else write_csv_twin(storage, item["table"], part) for part in kept]
    return run_result(kept, added, replaced, overwrite, types, schema)


def by_partition(item: dict, new, typed) -> list[tuple[dict | None, object, object]]:
    """``(partition, rows, typed)``: the new rows of each partition (one group, partition None, when the table has none)."""
    if not item["partitioning"] or not new.num_rows:
        return [(None, new, typed)]
    return partitions.split(new, typed, item["partitioning"], item["kinds"])


def partition_key(partition: dict | None) -> str | None:
    return None if partition is None else json_text(partition)


def open_tails(parts: list[dict], wanted: list[dict | None], part_rows: int) -> dict[str | None, dict]:
    """The open tail (``open_tail``: its partition's last part, while small) of each partition new rows go to, by ``partition_key``."""
    last = {partition_key(part.get("partition")): part for part in parts}  # parts in order: the last of each partition wins
    tails = {}
    for key in map(partition_key, wanted):
        tail = open_tail([last[key]], part_rows) if key in last else None
        if tail is not None:
            tails[key] = tail
    return tails


def project_small_streams(
    lake: Lake, spark, plans: list[StreamPlan], formats: list[str], failures: Failures, progress, part_rows: int = PART_ROWS
) -> dict:
    items = [work_item(plan, formats) | {"part_rows": part_rows} for plan in plans]
    work = functools.partial(project_on_executor, lake.storage)
    options = {"items_per_task": STREAMS_PER_TASK, "threads": CPU_THREADS, "sizes": [plan.bytes for plan in plans]}
    results = run_stream_items(spark, items, work, failures, progress, **options)
    return {(plan.tap_id, plan.stream): result for plan, result in zip(plans, results, strict=True) if result is not None}
