"""A replay's planned files, read in bulk: which data files hold the records after a position, in
replay order, and their records as typed Arrow batches (the Spark data sources, ``sql`` and the
projection read them so). Typed as the projection types them (``exact``, SPEC.md §12), then the
record's position (SPEC.md §11), version and time (SPEC.md §1).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

from singerlake.format.datafile import open_data_file
from singerlake.format.errors import ProjectionError
from singerlake.format.exact import Need, covers, decode, join_all, records_needs, typed_table
from singerlake.format.manifest import Manifest
from singerlake.format.messages import message_record
from singerlake.format.needs import StatsReader
from singerlake.format.positions import Position, already_replayed, entry_runs
from singerlake.storage import Storage
from singerlake.times import record_time_ms

if TYPE_CHECKING:
    from pyspark.sql import types as T

BATCH_ROWS = 8192


def columns(json_schema: dict, needs: dict[str, Need]) -> T.StructType:
    """The DataFrame schema of records under ``json_schema`` whose values need ``needs``: its properties, then the
    position columns."""
    from pyspark.sql import types as T  # here: a projection with nothing to do never imports Spark

    from singerlake.spark.schema import struct_type

    positions = [
        T.StructField("_singerlake_commit", T.LongType()),
        T.StructField("_singerlake_index", T.LongType()),
        T.StructField("_singerlake_version", T.StringType()),
        T.StructField("_singerlake_time", T.TimestampType()),
    ]
    return T.StructType(struct_type(json_schema, needs).fields + positions)


def plan_files(manifest: Manifest, hashes: set[str], after: Position | None, until: int) -> list[dict]:
    """The data files holding records of versions ``hashes`` after ``after``, committed by ``until``,
    in replay order: ``{"entry", "runs", "skip", "version"}`` (``skip``: records read already)."""
    labels = {h: info["version"] for h, info in manifest.versions.items()}
    files = []
    planned = manifest.plan(after.commit if after else None, until_commit=until)  # only the parts it needs
    for entry, runs in entry_runs(planned.files):
        skip = already_replayed(runs, after)
        if entry["schema_hash"] in hashes and runs[0].commit <= until and skip < entry["records"]:
            runs_doc = [[r.commit, r.first, r.records] for r in runs]
            files.append({"entry": entry, "runs": runs_doc, "skip": skip, "version": labels[entry["schema_hash"]]})
    return files


def planned_lines(storage: Storage, file: dict) -> Iterator[tuple[int, int, int, bytes]]:
    """``(index, commit, position, line)`` of each RECORD line of a planned file (``plan_files``) not read
    yet (from ``skip``, before ``take`` when given), after checking the file against its blake2 hash;
    ``index`` counts from the first RECORD line."""
    positions = [(commit, first + i) for commit, first, count in file["runs"] for i in range(count)]
    with open_data_file(storage, file["entry"]) as unzipped:
        unzipped.readline()  # the SCHEMA line
        for index, line in enumerate(unzipped):
            if index >= file.get("take", len(positions)):
                break  # a streaming micro-batch ends inside this file
            if index >= file["skip"]:
                yield (index, *positions[index], line)


def planned_messages(storage: Storage, file: dict) -> Iterator[list[tuple[int, int, dict]]]:
    """``(commit, position, message)`` of the unread RECORD messages of a planned file, decoded exactly, in lists of BATCH_ROWS."""
    lines = planned_lines(storage, file)
    while chunk := list(islice(lines, BATCH_ROWS)):
        yield [(commit, position, decode(line)) for _, commit, position, line in chunk]


def message_time(message: dict) -> int | None:
    """The record's time (SPEC.md §1); None when the message carries none of its own."""
    return record_time_ms(message.get("time_extracted"), functools.partial(message_record(message).get, "_sdc_extracted_at"))


def file_needs(storage: Storage, properties: dict, file: dict) -> dict[str, Need]:
    """What the values of a planned file's unread records need, per property (``exact``)."""
    needs: dict[str, Need] = {}
    for chunk in planned_messages(storage, file):
        needs = join_all([needs, records_needs(properties, [message_record(message) for _, _, message in chunk])])
    return needs


def planned_needs(storage: Storage, versions: dict, properties: dict, files: list[dict]) -> dict[str, Need]:
    """What the values of planned files need under ``properties``: from their entries' statistics
    (SPEC.md §5), reading here only the files whose statistics cannot tell (none on a lake landed
    under 2.1). A file read from a bookmark counts whole: possibly wider, never narrower."""
    known, unread = StatsReader(versions, properties).split(files)
    return join_all([known, *(file_needs(storage, properties, file) for file in unread)])


def _item_needs(storage: Storage, item: dict) -> dict[str, Need]:
    return file_needs(storage, item["properties"], item["file"])


def needs_on_executors(spark, storage: Storage, streams: list[tuple[dict, dict, list[dict]]]) -> list[dict[str, Need]]:
    """For each stream, given as its manifest's versions, the properties read and its planned files
    (``plan_files``), what its values need (``needs`` option): from the files' statistics, and the
    files without them read in one Spark job on the executors (no job when every file has them)."""
    from singerlake.spark.runner import run_items

    needs: list[dict[str, Need]] = []
    items = []
    for n, (versions, properties, files) in enumerate(streams):
        known, unread = StatsReader(versions, properties).split(files)
        needs.append(known)
        items += [{"stream": n, "properties": properties, "file": file} for file in unread]
    if not items:
        return needs
    sizes = [item["file"]["entry"]["size"] for item in items]
    found = run_items(spark, items, functools.partial(_item_needs, storage), sizes=sizes, items_per_task=16, threads=2)
    for item, result in zip(items, found, strict=True):
        needs[item["stream"]] = join_all([needs[item["stream"]], result])
    return needs


def file_batches(
    storage: Storage, schema: T.StructType, properties: dict, needs: dict[str, Need], file: dict, fixed: bool = False
) -> Iterator[Any]:
    """Arrow batches of one planned file (``plan_files``) under ``schema``: the properties typed by
    ``exact`` (the projection's ``typed_table``), then the position columns. ``fixed``: ``needs`` were found
    from other records (streaming), so a value needing more fails, naming its column."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    target = to_arrow_schema(schema, timezone="UTC")
    for chunk in planned_messages(storage, file):
        records = [message_record(message) for _, _, message in chunk]
        if fixed:
            check_fits(properties, needs, records)
        typed = typed_table(properties, needs, records)
        times = [message_time(message) for _, _, message in chunk]
        positions = [
            pa.array([commit for commit, _, _ in chunk], pa.int64()),
            pa.array([position for _, position, _ in chunk], pa.int64()),
            pa.array([file["version"]] * len(chunk), pa.string()),
            pa.array(times, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        ]
        table = pa.Table.from_arrays([*typed.columns, *positions], names=target.names)
        yield from table.cast(target).combine_chunks().to_batches()


def check_fits(properties: dict, needs: dict[str, Need], records: list[dict]) -> None:
    """Refuse records a value of which needs a wider type than its column was given, naming the column."""
    for name, need in records_needs(properties, records).items():
        if not covers(needs.get(name), need):
            raise ProjectionError(
                f"column {name!r}: a value needs {json.dumps(need)}, more than the column's type (found from the records "
                f"read when the query started: {json.dumps(needs.get(name))}); restart the query to type it anew"
            )
