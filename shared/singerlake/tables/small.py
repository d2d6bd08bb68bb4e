"""Small streams: one work item each, all in ONE Spark job, with pyarrow on the executor; their new
rows form parts of at most ``PART_ROWS`` rows, and a previous part holding an updated key is rewritten."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

from singerlake.format.exact import join_all, records_needs
from singerlake.lake import Lake
from singerlake.spark.runner import (
    Failures,
    run_stream_items,
)
from singerlake.storage import Storage
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
    if typed is not None and typing[1] == item["types"]:  # the tail's file is typed alike: no row decoded again
        published = read_parquet(storage, f"{item['table']}/{tail['published']}")
        typed = pa.concat_tables([published if keep is None else published.filter(keep), typed.cast(published.schema)])
    else:
        typed = None
    new_needs = item["needs"] if item["needs"] is not None else records_needs(item["properties"], records_of(new))
    return pa.concat_tables([rows, new]), typed, join_all([tail["needs"], new_needs])


def project_on_executor(storage: Storage, item: dict) -> dict:
    """Executor side: project one small stream: rewrite the parts a new record updates (only those whose
    key range may hold one are read), add the new current rows to the open tail part or as a new part,
    publish what changed (everything when the column types changed)."""
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
    tail = open_tail(item["parts"], item["part_rows"]) if not activations and new.num_rows else None
    kept, replaced, fresh, trimmed = [], [], [], []
    for part in item["parts"][:-1] if tail else item["parts"]:
        holds = len(updated) and may_hold(part, updated)
        if holds and pc.any(pc.is_in(read_parquet(storage, part["staging"], ["_key"])["_key"], value_set=updated)).as_py():
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
    if tail is not None:
        replaced.append(tail)
        new, typed, new_needs = join_tail(storage, item, tail, updated, new, typed, typing)
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
        added = list(pool.map(lambda t: publish_part(t[0], published=None if overwrite else t[1]), trimmed))
        # the newest rows last: the open tail
        added += list(pool.map(lambda w: publish_part(w[0], staging=w[1], published=w[2] if same else None), written))
    if item["csv"]:
        kept = [part if "csv" in part else write_csv_twin(storage, item["table"], part) for part in kept]
    return run_result(kept, added, replaced, overwrite, types, schema)


def project_small_streams(
    lake: Lake, spark, plans: list[StreamPlan], formats: list[str], failures: Failures, progress, part_rows: int = PART_ROWS
) -> dict:
    items = [work_item(plan, formats) | {"part_rows": part_rows} for plan in plans]
    work = functools.partial(project_on_executor, lake.storage)
    options = {"items_per_task": STREAMS_PER_TASK, "threads": CPU_THREADS, "sizes": [plan.bytes for plan in plans]}
    results = run_stream_items(spark, items, work, failures, progress, **options)
    return {(plan.tap_id, plan.stream): result for plan, result in zip(plans, results, strict=True) if result is not None}
