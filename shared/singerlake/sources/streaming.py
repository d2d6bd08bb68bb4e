"""``spark.readStream.format("singerlake")``: a lake stream's records as they are committed (SPEC.md §12).

    register(spark)
    query = (spark.readStream.format("singerlake")
             .option("tap_id", "tap-postgres").option("stream", "public.users")
             .load("s3://bucket/lake")
             .writeStream.option("checkpointLocation", "/chk/users").toTable("users_raw"))

Offsets are record positions (SPEC.md §11) with the manifest's generation,
``{"commit": C, "records": R, "generation": G}``: a micro-batch reads the records after its start
offset up to its end offset, so a query restarted from its checkpoint reads each record once, across
compactions (compacted files keep their records' positions). The columns are the batch source's,
fixed when the query starts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pyspark.sql import types as T
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxFiles, ReadMaxRows, SupportsTriggerAvailableNow

from singerlake.errors import ConfigError
from singerlake.format.errors import BadBookmark
from singerlake.format.exact import Need
from singerlake.format.manifest import Manifest
from singerlake.format.positions import Position, Run, already_replayed, check_bookmark
from singerlake.lake import Lake
from singerlake.replay.plan import file_batches, plan_files
from singerlake.storage import Storage


class _StreamPartition(InputPartition):
    def __init__(self, file: dict):
        super().__init__(file)
        self.file = file


def _limit_option(options: Any, name: str) -> int | None:
    value = options.get(name)
    if value is None or value == "":
        return None
    if not str(value).isdigit() or int(value) < 1:
        raise ConfigError(f"singerlake streaming source: option {name!r} must be a positive integer, got {value!r}")
    return int(value)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver from the manifest root (one read per offset asked) and reads
    each planned data file on an executor, typed like the batch source under the schema found at start."""

    def __init__(
        self,
        storage: Storage,
        tap_id: str,
        stream: str,
        schema: T.StructType,
        properties: dict,
        needs: dict[str, Need],
        hashes: set[str] | None,
        options: Any,
    ):
        self.storage, self.tap_id, self.stream, self.schema = storage, tap_id, stream, schema
        self.properties, self.needs, self.hashes = properties, needs, hashes  # hashes None: every version
        self.after = options.get("after")
        self.starting = options.get("startingPosition") or "earliest"
        if self.starting not in ("earliest", "latest"):
            raise ConfigError(f"singerlake streaming source: startingPosition must be 'earliest' or 'latest', got {self.starting!r}")
        if self.after and self.starting == "latest":
            raise ConfigError("singerlake streaming source: give either 'after' or startingPosition 'latest', not both")
        self.max_records = _limit_option(options, "maxRecordsPerTrigger")
        self.max_files = _limit_option(options, "maxFilesPerTrigger")
        if self.max_records and self.max_files:
            raise ConfigError("singerlake streaming source: give maxRecordsPerTrigger or maxFilesPerTrigger, not both")
        self.target: Position | None = None  # Trigger.AvailableNow: what was committed when the query started

    # -- the manifest and positions --------------------------------------------------------------
    def _manifest(self) -> Manifest:
        return Lake(self.storage).manifest(self.tap_id, self.stream)

    def _end(self, manifest: Manifest) -> Position:
        return Position(*manifest.end_position(), manifest.generation)

    def _position(self, offset: dict, manifest: Manifest) -> Position:
        """An offset of this query as a position, refused (naming the stream) when the manifest was rebuilt since."""
        position = Position.from_bookmark(offset, self.stream)
        try:
            check_bookmark(position, manifest)
        except BadBookmark as exc:
            raise BadBookmark(
                f"singerlake streaming source, tap {self.tap_id!r}, {exc} Or start the query anew (a new checkpoint location)."
            ) from None
        return position

    def _hashes(self, manifest: Manifest) -> set[str]:
        """The versions read: the chosen one, or every version; a version landed since the query started
        must fit its columns (no property the start's schema lacks)."""
        if self.hashes is not None:
            return self.hashes
        for info in manifest.versions.values():
            extra = sorted(set(info["schema"].get("properties", {})) - set(self.properties))
            if extra:
                raise ConfigError(
                    f"singerlake streaming source: stream {self.stream!r} of tap {self.tap_id!r} has a new version "
                    f"{info['version']!r} with properties {extra} that the query's columns lack; restart the query to read them"
                )
        return set(manifest.versions)

    # -- offsets -------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        manifest = self._manifest()
        if self.after:
            start = Position.from_bookmark(json.loads(self.after), self.stream)
            check_bookmark(start, manifest)
            return Position(start.commit, start.records, start.generation or manifest.generation).to_bookmark()
        if self.starting == "latest":
            return self._end(manifest).to_bookmark()
        return Position(0, 0, manifest.generation).to_bookmark()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_records:
            return ReadMaxRows(self.max_records)
        if self.max_files:
            return ReadMaxFiles(self.max_files)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._end(self._manifest())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        manifest = self._manifest()
        begin = self._position(start, manifest)
        end = self._end(manifest)
        if self.target is not None and self.target < end:
            end = Position(self.target.commit, self.target.records, manifest.generation)
        if end <= begin:
            return start  # nothing new
        if isinstance(limit, (ReadMaxRows, ReadMaxFiles)):
            end = self._limited(manifest, begin, end, limit)
        return end.to_bookmark() if end > begin else start

    def _limited(self, manifest: Manifest, begin: Position, end: Position, limit: ReadLimit) -> Position:
        """The position after at most ``limit`` records (or files) of the selected versions after ``begin``, up to ``end``."""
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        files = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        for file in self._planned(manifest, begin, end):
            positions = [(commit, first + i) for commit, first, count in file["runs"] for i in range(count)]
            wanted = positions[file["skip"] : file["take"]]
            if rows is not None and len(wanted) >= rows:
                commit, index = wanted[rows - 1]
                return Position(commit, index + 1, end.generation)
            if rows is not None:
                rows -= len(wanted)
            if files is not None:
                files -= 1
                if files == 0:
                    commit, index = wanted[-1]
                    return Position(commit, index + 1, end.generation)
        return end

    def reportLatestOffset(self) -> dict | None:
        return self._end(self._manifest()).to_bookmark()

    # -- micro-batches ---------------------------------------------------------------------------
    def _planned(self, manifest: Manifest, begin: Position, end: Position) -> list[dict]:
        """The data files holding selected records after ``begin`` up to ``end``, each with ``take``: its
        records before ``end`` (a compacted file may hold records committed after ``end``)."""
        planned = []
        for file in plan_files(manifest, self._hashes(manifest), begin, end.commit):
            take = already_replayed([Run(*run) for run in file["runs"]], end)
            if take > file["skip"]:
                planned.append({**file, "take": take})
        return planned

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        manifest = self._manifest()
        begin, stop = self._position(start, manifest), self._position(end, manifest)
        if stop <= begin:
            return []
        return [_StreamPartition(file) for file in self._planned(manifest, begin, stop)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return file_batches(self.storage, self.schema, self.properties, self.needs, partition.file, fixed=True)

    def commit(self, end: dict) -> None:
        pass  # nothing to release: the lake keeps every record until compaction and vacuum
