"""``spark.read.format("singerlake")``: a lake stream as a typed DataFrame, read on the executors.

    from singerlake.sources import register
    register(spark)
    users = (spark.read.format("singerlake")
             .option("tap_id", "tap-postgres").option("stream", "public.users")
             .load("s3://bucket/lake"))          # or a local path

Options: ``tap_id``, ``stream`` (required); ``version`` (``all``: every version under one merged
schema, the default; or a label like ``v2``, or a schema hash); ``after`` (a replay position as
JSON, ``{"commit": C, "records": R}``: only records after it); ``until_commit`` (ignore files
committed later); ``needs`` (what the values need, as ``replay.plan.needs_on_executors`` finds them: skips
the scan below); for S3 roots ``s3_<option>`` for each storage option (``s3_endpoint_url``,
``s3_region``, ``s3_profile``, keys; Spark redacts the secret ones in its plans and UI).

Columns: the stream's properties, typed exactly as the projection types them (``exact``, SPEC.md
§12: ``decimal(p, s)`` where the values fit, JSON text otherwise and for JSON values, names taken
literally), then ``_singerlake_commit`` and ``_singerlake_index`` (the record's position, SPEC.md
§11), ``_singerlake_version`` and ``_singerlake_time`` (the record's time, SPEC.md §1, when it has
one). The types depend on the values read: without ``needs`` the schema is found from the files'
column statistics in the manifest (SPEC.md §5; no data file is read when every file has them), and
the records of files without them are read once on the driver; ``needs_on_executors`` reads those on
the executors instead (``singerlake sql --raw`` does). Each partition is one data file, verified against its blake2 hash
before it is read, and yields Arrow batches.

``spark.readStream.format("singerlake")`` (same options, and ``startingPosition``,
``maxRecordsPerTrigger``, ``maxFilesPerTrigger``) reads the records as they are committed:
``sources/streaming.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from singerlake.errors import ConfigError
from singerlake.format.catalogue import replay_schema
from singerlake.format.exact import Need
from singerlake.format.manifest import Manifest
from singerlake.format.positions import Position, check_bookmark
from singerlake.lake import Lake
from singerlake.replay.plan import columns, file_batches, plan_files, planned_needs
from singerlake.storage import Storage, s3_options


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
        lake = Lake.open(self._option("path"), **s3_options(self.options.get))
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

    def _files(self, manifest: Manifest, hashes: set[str], until: int | None = None) -> list[dict]:
        after = Position.from_bookmark(json.loads(self.options["after"]), manifest.stream) if self.options.get("after") else None
        check_bookmark(after, manifest)
        until = until or int(self.options.get("until_commit") or manifest.commits)
        self._until = until  # the reader reads what the schema was found from, whatever is committed meanwhile
        return plan_files(manifest, hashes, after, until)

    def _needs(self, storage: Storage, manifest: Manifest, properties: dict, files: list[dict]) -> dict[str, Need]:
        if self.options.get("needs"):
            return json.loads(self.options["needs"])
        if getattr(self, "_found_needs", None) is None:  # found once, by schema(): this object is pickled on to reader()
            self._found_needs = planned_needs(storage, manifest.versions, properties, files)
        return self._found_needs

    def schema(self) -> T.StructType:
        lake, manifest, schema, hashes = self._selected()
        return columns(schema, self._needs(lake.storage, manifest, schema.get("properties", {}), self._files(manifest, hashes)))

    def streamReader(self, schema: T.StructType) -> DataSourceStreamReader:
        from singerlake.sources.streaming import StreamReader

        lake, manifest, json_schema, hashes = self._selected()
        properties = json_schema.get("properties", {})
        files = self._files(manifest, hashes)
        return StreamReader(
            lake.storage,
            self._option("tap_id"),
            manifest.stream,
            schema,
            properties,
            self._needs(lake.storage, manifest, properties, files),
            None if self.options.get("version", "all") == "all" else hashes,
            self.options,
        )

    def reader(self, schema: T.StructType) -> DataSourceReader:
        lake, manifest, json_schema, hashes = self._selected()
        files = self._files(manifest, hashes, getattr(self, "_until", None))
        properties = json_schema.get("properties", {})
        return _Reader(lake.storage, schema, properties, self._needs(lake.storage, manifest, properties, files), files)


class _FilePartition(InputPartition):
    def __init__(self, file: dict):
        super().__init__(file)
        self.file = file


class _Reader(DataSourceReader):
    def __init__(self, storage: Storage, schema: T.StructType, properties: dict, needs: dict[str, Need], files: list[dict]):
        self.storage, self.schema, self.properties, self.needs, self.files = storage, schema, properties, needs, files

    def partitions(self) -> list[InputPartition]:
        return [_FilePartition(file) for file in self.files]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return file_batches(self.storage, self.schema, self.properties, self.needs, partition.file)
