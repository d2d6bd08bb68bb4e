"""``spark.read.format("singerlake-files")``: the index of pushed files (SPEC.md §14) as a DataFrame.

    import singerlake
    singerlake.register_datasource(spark)            # "singerlake" and "singerlake-files"
    logs = (spark.read.format("singerlake-files")
            .option("what", "syslog").option("where", "web")
            .option("start", "2026-11-01").option("end", "2026-11-02")   # or .option("work_id", "run-42")
            .option("content", "true")                                   # the bytes too, read on the executors
            .load("s3://bucket/lake"))

Options: ``what`` (required; several separated by commas), ``where`` (a prefix), ``start`` and
``end`` (as typed, SPEC.md §14: ISO 8601, ``now``, ``-1d``, epoch s or ms; ``end`` defaults to now) or ``work_id``: the query
``Lake.find_files`` runs, through the index (``files/index.py``: the day or work pointers, then
the segments they name), on the driver; ``content`` (``true``: a binary ``content`` column, each
file read and checked against its blake2 hash on an executor, like Spark's ``binaryFile``);
``partitions`` (default: about 64 MiB of content, or 50,000 rows without it, per partition, and up
to 8 partitions for a few files so their reads run in parallel); for S3 roots ``s3_<option>``
(``s3_endpoint_url``, ``s3_region``, ``s3_profile``, keys) as for ``singerlake``.

Columns: the record's fields (``id``, ``what``, ``where``, ``work_id``, ``start`` and ``end`` as UTC
timestamps, ``start_iso``, ``end_iso``, ``hash``, ``size``, ``name``, ``content_type``, ``path``,
``key``, ``txn``, ``created`` as the record's ISO text, ``version``), in the order of the query.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import datetime, timezone

from pyspark.sql import types as T
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from singerlake.errors import ConfigError
from singerlake.lake import Lake
from singerlake.storage import Storage, s3_options

NAME = "singerlake-files"
_S, _L, _TS = T.StringType(), T.LongType(), T.TimestampType()
RECORD_COLUMNS = [
    ("id", _S), ("what", _S), ("where", _S), ("work_id", _S), ("start", _TS), ("end", _TS), ("start_iso", _S), ("end_iso", _S),
    ("hash", _S), ("size", _L), ("name", _S), ("content_type", _S), ("path", _S), ("key", _S), ("txn", _S), ("created", _S),
    ("version", _L),
]  # fmt: skip
TIME_COLUMNS = {"start", "end"}
PARTITION_BYTES = 64 << 20
PARTITION_ROWS = 50_000
PARALLEL_READS = 8  # a few files with content still spread over this many partitions


def columns(content: bool) -> T.StructType:
    fields = [T.StructField(name, kind) for name, kind in RECORD_COLUMNS]
    return T.StructType(fields + ([T.StructField("content", T.BinaryType())] if content else []))


def _truthy(value: str | None) -> bool:
    if value is None or value.lower() in ("", "false", "0", "no"):
        return False
    if value.lower() in ("true", "1", "yes"):
        return True
    raise ConfigError(f"{NAME} data source: option 'content' must be true or false, not {value!r}")


def split(records: list[dict], content: bool, wanted: int | None = None) -> list[list[dict]]:
    """The records, in order, cut into partitions: by bytes with content (and at least a few), by rows without."""
    if not records:
        return []
    if wanted is None:
        if content:
            wanted = max(math.ceil(sum(r["size"] for r in records) / PARTITION_BYTES), min(len(records), PARALLEL_READS))
        else:
            wanted = math.ceil(len(records) / PARTITION_ROWS)
    per = math.ceil(len(records) / max(1, min(wanted, len(records))))
    return [records[first : first + per] for first in range(0, len(records), per)]


class FilesDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def _content(self) -> bool:
        return _truthy(self.options.get("content"))

    def schema(self) -> T.StructType:
        return columns(self._content())

    def _lake(self) -> Lake:
        root = self.options.get("path")
        if not root:
            raise ConfigError(f"{NAME} data source: give the lake root to load()")
        lake = Lake.open(root, **s3_options(self.options.get))
        lake.check_exists()
        return lake

    def records(self) -> tuple[Storage, list[dict]]:
        """The query's records, found through the index (``Lake.find_files``)."""
        what = self.options.get("what")
        if not what:
            raise ConfigError(f"{NAME} data source: option 'what' is required")
        whats = [w for w in what.split(",") if w]
        work_id, start, end = self.options.get("work_id"), self.options.get("start"), self.options.get("end")
        if work_id and (start or end):
            raise ConfigError(f"{NAME} data source: give either 'work_id' or 'start'/'end', not both")
        if not work_id and not start:
            raise ConfigError(f"{NAME} data source: say which files: option 'start' (and 'end') or 'work_id'")
        lake = self._lake()
        where = self.options.get("where") or ""
        found = (
            lake.find_files(whats, where=where, work_id=work_id) if work_id else lake.find_files(whats, where=where, start=start, end=end)
        )
        return lake.storage, found

    def reader(self, schema: T.StructType) -> DataSourceReader:
        storage, records = self.records()
        wanted = self.options.get("partitions")
        try:
            count = int(wanted) if wanted else None
        except ValueError:
            raise ConfigError(f"{NAME} data source: option 'partitions' must be a number, not {wanted!r}") from None
        content = "content" in schema.fieldNames()
        return _Reader(storage, content, split(records, content, count))


class _Partition(InputPartition):
    def __init__(self, records: list[dict]):
        super().__init__(len(records))
        self.records = records


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def row_of(record: dict) -> tuple:
    return tuple(_time(record[name]) if name in TIME_COLUMNS else record.get(name) for name, _ in RECORD_COLUMNS)


def content_of(storage: Storage, record: dict) -> bytes:
    """The file's bytes, checked against its record's hash and size (as ``fetch`` checks them)."""
    from singerlake.files.fetch import check_bytes
    from singerlake.format.metadata import new_digest

    data = storage.read(record["key"]).data
    digest = new_digest()
    digest.update(data)
    check_bytes(storage, record, digest.hexdigest(), len(data))
    return data


class _Reader(DataSourceReader):
    def __init__(self, storage: Storage, content: bool, parts: list[list[dict]]):
        self.storage, self.content, self.parts = storage, content, parts

    def partitions(self) -> list[InputPartition]:
        return [_Partition(records) for records in self.parts] or [_Partition([])]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        if not self.content:
            yield from map(row_of, partition.records)
            return
        from concurrent.futures import ThreadPoolExecutor

        # Reads wait on storage: a few at once, in order, at most a window of them held in memory.
        with ThreadPoolExecutor(min(self.storage.parallel_requests, 8)) as pool:
            window = 16
            records = partition.records
            for first in range(0, len(records), window):
                batch = records[first : first + window]
                for record, data in zip(batch, pool.map(lambda r: content_of(self.storage, r), batch), strict=True):
                    yield (*row_of(record), data)
