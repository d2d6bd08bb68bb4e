"""``spark.read.format("singerlake")``: a lake stream as a typed DataFrame, read on the executors.

    from singerlake.replay.datasource import register
    register(spark)
    users = (spark.read.format("singerlake")
             .option("tap_id", "tap-postgres").option("stream", "public.users")
             .load("s3://bucket/lake"))          # or a local path

Options: ``tap_id``, ``stream`` (required); ``version`` (``all``: every version under one merged
schema, the default; or a label like ``v2``, or a schema hash); ``after`` (a replay position as
JSON, ``{"commit": C, "records": R}``: only records after it); ``until_commit`` (ignore files
committed later); for S3 roots ``s3_<option>`` for each storage option (``s3_endpoint_url``,
``s3_region``, ``s3_profile``, keys; Spark redacts the secret ones in its plans and UI).

Columns: the stream's properties (types from its JSON schema, see ``spark_schema``), then
``_singerlake_commit`` and ``_singerlake_index`` (the record's position, SPEC.md §11),
``_singerlake_version`` and ``_singerlake_time`` (the record's time, SPEC.md §1, when it has one).
Each partition is one data file, verified against its blake2 hash before it is read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from functools import partial

from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from singerlake.errors import ConfigError
from singerlake.format.catalogue import replay_schema
from singerlake.format.datafile import open_data_file
from singerlake.format.exact import decode
from singerlake.format.manifest import Manifest
from singerlake.format.positions import Position, already_replayed, check_bookmark, entry_runs
from singerlake.lake import Lake
from singerlake.spark.schema import row_converter, struct_type
from singerlake.storage import S3_OPTIONS, Storage
from singerlake.times import record_time_ms

POSITION_COLUMNS = [
    T.StructField("_singerlake_commit", T.LongType()),
    T.StructField("_singerlake_index", T.LongType()),
    T.StructField("_singerlake_version", T.StringType()),
    T.StructField("_singerlake_time", T.TimestampType()),
]


def columns(json_schema: dict) -> T.StructType:
    """The DataFrame schema of records under ``json_schema``: its properties, then POSITION_COLUMNS."""
    return T.StructType(struct_type(json_schema).fields + POSITION_COLUMNS)


def register(spark) -> None:
    """Make ``format("singerlake")`` available on ``spark``; a cluster's executors get the core shipped."""
    from singerlake.spark.executors import prepare_executors

    prepare_executors(spark)
    spark.dataSource.register(SingerlakeDataSource)


class SingerlakeDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "singerlake"

    def _option(self, name: str) -> str:
        value = self.options.get(name)
        if not value:
            raise ConfigError(f"singerlake data source: option {name!r} is required")
        return value

    def _lake(self) -> Lake:
        options = {name: self.options.get(f"s3_{name}") for name in S3_OPTIONS}
        lake = Lake.open(self._option("path"), **options)
        lake.check_exists()
        return lake

    def _selected(self):
        lake = self._lake()
        tap_id, stream = self._option("tap_id"), self._option("stream")
        lake.check_tap(tap_id)
        manifest = lake.manifest(tap_id, stream)
        if not manifest.versions:
            raise ConfigError(f"singerlake data source: stream {stream!r} of tap {tap_id!r} has no data")
        wanted = self.options.get("version", "all")
        if wanted == "all":
            return lake, manifest, replay_schema(manifest), set(manifest.versions)
        for schema_hash, info in manifest.versions.items():
            if wanted in (schema_hash, info["version"]):
                return lake, manifest, info["schema"], {schema_hash}
        labels = [v["version"] for v in manifest.versions.values()]
        raise ConfigError(f"singerlake data source: stream {stream!r} has no version {wanted!r}; versions: {labels}")

    def schema(self) -> T.StructType:
        _, _, schema, _ = self._selected()
        return columns(schema)

    def reader(self, schema: T.StructType) -> DataSourceReader:
        lake, manifest, _, hashes = self._selected()
        after = Position.from_bookmark(json.loads(self.options["after"]), manifest.stream) if self.options.get("after") else None
        check_bookmark(after, manifest)
        until = int(self.options.get("until_commit") or manifest.commits)
        return _Reader(lake.storage, schema, plan_files(manifest, hashes, after, until))


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
    yet, after checking the file against its blake2 hash; ``index`` counts from the first RECORD line."""
    positions = [(commit, first + i) for commit, first, count in file["runs"] for i in range(count)]
    with open_data_file(storage, file["entry"]) as unzipped:
        unzipped.readline()  # the SCHEMA line
        for index, line in enumerate(unzipped):
            if index >= file["skip"]:
                yield (index, *positions[index], line)


def file_rows(storage: Storage, schema: T.StructType, file: dict) -> Iterator[tuple]:
    """The rows of one planned file (``plan_files``) under ``schema`` (properties, then POSITION_COLUMNS)."""
    convert = row_converter(T.StructType(schema.fields[: -len(POSITION_COLUMNS)]))
    for _, commit, position, line in planned_lines(storage, file):
        message = decode(line)
        record = message.get("record") or {}
        ms = record_time_ms(message.get("time_extracted"), partial(record.get, "_sdc_extracted_at"))  # None: no time of its own
        time = None if ms is None else datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
        yield (*convert(record), commit, position, file["version"], time)


class _FilePartition(InputPartition):
    def __init__(self, file: dict):
        super().__init__(file)
        self.file = file


class _Reader(DataSourceReader):
    def __init__(self, storage: Storage, schema: T.StructType, files: list[dict]):
        self.storage, self.schema, self.files = storage, schema, files

    def partitions(self) -> list[InputPartition]:
        return [_FilePartition(file) for file in self.files]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        return file_rows(self.storage, self.schema, partition.file)
