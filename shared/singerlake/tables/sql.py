"""``singerlake sql``: Spark SQL over one tap's streams (SPEC.md §12).

Each stream is a temporary view named by the stream's name: its current rows as the latest
version of its Delta table holds them (read on the executors through the lake's storage, so S3
needs no Hadoop connector), or with ``raw`` every landed record through the ``singerlake`` data
source, with its position columns, typed exactly as the projection types them: the values of the
streams the query names are read once on the executors to find their types (one Spark job), then
again by the query. Results print as an aligned table, JSON or CSV.
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Iterator
from typing import Any

from singerlake.errors import ConfigError
from singerlake.format.catalogue import replay_schema
from singerlake.lake import Lake
from singerlake.storage import Storage
from singerlake.tables import delta


def view_name(stream: str) -> str:
    """The stream's name as one identifier, whatever it holds (``public.users`` is not schema ``public``)."""
    return "`" + stream.replace("`", "``") + "`"


def chosen_tap(lake: Lake, tap_id: str | None) -> str:
    if tap_id:
        lake.check_tap(tap_id)
        return tap_id
    taps = lake.taps()
    if len(taps) != 1:
        raise ConfigError(f"the lake has taps {taps}: choose one with --tap" if taps else "the lake has no taps")
    return taps[0]


def _read_published(storage: Storage, keys: list[str], target, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: the published Parquet files whose numbers are in the input, as Spark's Arrow types."""
    import pyarrow.parquet as pq

    for batch in batches:
        for number in batch.column("id").to_pylist():
            yield from pq.read_table(io.BytesIO(storage.read(keys[number]).data)).cast(target).to_batches()


def current_rows(lake: Lake, spark, tap_id: str, stream: str):
    """The stream's current rows (the latest table version), or None before its first projection."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    from singerlake.spark.schema import arrow_schema

    key = delta.table_key(tap_id, stream)
    published = delta.latest(lake.storage, key)
    if published.state is None:
        return None
    schema = from_arrow_schema(pa.schema(delta.open_table(lake.storage, key, published.version).schema().to_arrow()))
    files = [f"{key}/{part['published']}" for part in published.state["parts"]]
    if not files:
        return spark.createDataFrame([], schema)
    target = arrow_schema(schema, spark.conf.get("spark.sql.session.timeZone"))
    read = functools.partial(_read_published, lake.storage, files, target)
    return spark.range(len(files), numPartitions=len(files)).mapInArrow(read, schema)


def named_in(query: str, stream: str) -> bool:
    """Whether ``query`` can name the stream's view: its text holds the name (identifiers are case-insensitive)."""
    text = query.casefold()
    return stream.casefold() in text or stream.replace("`", "``").casefold() in text


def raw_records(lake: Lake, spark, tap_id: str, streams: list[str]) -> dict[str, Any]:
    """Every landed record of each stream, exactly typed, with its position columns: the values'
    types are found from the files' statistics (SPEC.md §5), and the values of files without them on
    the executors (one Spark job for all ``streams``, none when every file has them), then handed to
    the data source."""
    from singerlake.replay.plan import needs_on_executors, plan_files
    from singerlake.sources import register

    register(spark)
    manifests = [manifest for manifest in (lake.manifest(tap_id, stream) for stream in streams) if manifest.versions]
    plans = [
        (
            manifest.versions,
            replay_schema(manifest).get("properties", {}),
            plan_files(manifest, set(manifest.versions), None, manifest.commits),
        )
        for manifest in manifests
    ]
    frames = {}
    for manifest, needs in zip(manifests, needs_on_executors(spark, lake.storage, plans), strict=True):
        reader = spark.read.format("singerlake").option("tap_id", tap_id).option("stream", manifest.stream)
        reader = reader.option("until_commit", str(manifest.commits)).option("needs", json.dumps(needs))
        for name, value in lake.storage.open_options().items():
            reader = reader.option(f"s3_{name}", value)
        frames[manifest.stream] = reader.load(lake.storage.url)
    return frames


class SqlSession:
    """One tap's streams as views in one Spark session, for many statements (``singerlake sql`` without
    a query: the shell). Each view is registered once, when a statement first needs it: every
    current-rows view at the first statement (no Spark job: the tables' latest versions are read
    here), or with ``raw`` a stream's view when a statement first names it (its one typing job)."""

    def __init__(self, lake: Lake, spark, tap_id: str | None = None, raw: bool = False):
        self.lake, self.spark, self.raw = lake, spark, raw
        self.tap_id = chosen_tap(lake, tap_id)
        self.streams = lake.streams(self.tap_id)
        self.registered: dict[str, bool] = {}  # stream -> whether it has a view (False: nothing to query yet)

    def views(self) -> list[tuple[str, str]]:
        """Each stream with what its view holds: current rows, every record, not projected yet, or
        (raw) registered when a statement names it."""
        kind = "every record" if self.raw else "current rows"
        return [
            (stream, kind if self.registered.get(stream, True) else "no rows yet (not projected)" if not self.raw else "no records")
            for stream in self.streams
        ]

    def register(self, statement: str) -> None:
        """Register the views ``statement`` may need that are not registered yet."""
        if self.raw:  # only the streams the statement names: finding a stream's exact types reads all its records
            wanted = [stream for stream in self.streams if stream not in self.registered and named_in(statement, stream)]
            frames = raw_records(self.lake, self.spark, self.tap_id, wanted) if wanted else {}
        else:
            wanted = [stream for stream in self.streams if stream not in self.registered]
            frames = {stream: current_rows(self.lake, self.spark, self.tap_id, stream) for stream in wanted}
        for stream in wanted:
            frame = frames.get(stream)
            if frame is not None:
                frame.createOrReplaceTempView(view_name(stream))
            self.registered[stream] = frame is not None

    def run(self, statement: str) -> tuple[list[str], list[tuple]]:
        """Run one statement over the views: (column names, rows). A failed statement is a ConfigError of one line."""
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException

        self.register(statement)
        try:
            result = self.spark.sql(statement)
            return result.columns, [tuple(row) for row in result.collect()]
        except PySparkException as exc:
            raise ConfigError(f"the query failed: {first_line(str(exc))}") from None
        except Py4JJavaError as exc:  # a job's failure that PySpark does not translate (a task's error)
            raise ConfigError(f"the query failed: {first_line(str(exc.java_exception))}") from None


def first_line(text: str) -> str:
    return (text.strip().splitlines() or ["(no message)"])[0]


def run_query(lake: Lake, spark, query: str, tap_id: str | None = None, raw: bool = False) -> tuple[list[str], list[tuple]]:
    """Register the tap's streams as views and run ``query``: (column names, rows)."""
    return SqlSession(lake, spark, tap_id, raw).run(query)
