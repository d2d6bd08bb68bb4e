"""``singerlake sql``: Spark SQL over one tap's streams (SPEC.md §12).

Each stream is a temporary view named by the stream's name: its current rows as the latest
version of its Delta table holds them (read on the executors through the lake's storage, so S3
needs no Hadoop connector), or with ``raw`` every landed record through the ``singerlake`` data
source, with its position columns, typed exactly as the projection types them: the values of the
streams the query names are read once on the executors to find their types (one Spark job), then
again by the query. Results print as an aligned table, JSON or CSV. Chosen column types (``--type``,
``overrides``) convert a view's columns on the executors, as the projection would (SPEC.md §12).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

from singerlake.errors import ConfigError
from singerlake.format.catalogue import replay_schema
from singerlake.format.errors import ProjectionError
from singerlake.lake import Lake
from singerlake.storage import Storage
from singerlake.tables import delta, overrides, partitions
from singerlake.tables.columns import note, published_table, table_columns
from singerlake.tables.parts import published_batches


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


def _chosen_batches(chosen: dict, target, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: a raw view's batches with their chosen columns converted (positions from the batch)."""
    import pyarrow as pa

    for batch in batches:
        rows = pa.Table.from_batches([batch])
        yield from overrides.converted(chosen, rows, functools.partial(_batch_position, rows)).cast(target).to_batches()


def _batch_position(rows, row: int) -> str:
    return overrides.position_text(rows["_singerlake_commit"][row].as_py(), rows["_singerlake_index"][row].as_py())


def chosen_spark_schema(schema, types: dict):
    """A Spark schema with the chosen columns' types."""
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import from_arrow_type

    return T.StructType(
        [T.StructField(f.name, from_arrow_type(overrides.arrow_type(types[f.name]))) if f.name in types else f for f in schema.fields]
    )


def current_rows(lake: Lake, spark, tap_id: str, stream: str, chosen: dict | None = None):
    """The stream's current rows (the latest table version), or None before its first projection;
    ``chosen``: ``{"stream", "types", "json"}``, the columns to convert and the JSON-text ones. A partitioned
    table is a union of one scan per partition, each filtered by its partition's values, so Spark's optimizer
    drops the scans a filter (`=`, `<`, `>`... on a partition column) rules out: their files are not read."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    from singerlake.spark.schema import arrow_schema

    chosen = chosen or {"stream": stream, "types": {}, "json": []}
    key = delta.table_key(tap_id, stream)
    published = delta.latest(lake.storage, key)
    if published.state is None:
        return None
    schema = from_arrow_schema(pa.schema(delta.open_table(lake.storage, key, published.version).schema().to_arrow()))
    schema = chosen_spark_schema(schema, chosen["types"])
    if not published.state["parts"]:
        return spark.createDataFrame([], schema)
    target = arrow_schema(schema, spark.conf.get("spark.sql.session.timeZone"))
    columns = partitions.columns(published.state.get("partitioning"))
    groups: dict[str, list[dict]] = {}
    for part in published.state["parts"]:
        groups.setdefault(json.dumps(part.get("partition", {}), sort_keys=True), []).append(part)
    if not columns or len(groups) > PRUNED_PARTITIONS:
        return _scan(lake.storage, spark, key, published.state["parts"], schema, target, chosen)
    scans = [
        _scan(lake.storage, spark, key, parts, schema, target, chosen).where(_holds(schema, parts[0]["partition"]))
        for parts in groups.values()
    ]
    return functools.reduce(lambda one, other: one.unionByName(other), scans)


PRUNED_PARTITIONS = 1000  # beyond this many, one scan of every file: planning a wider union costs more than it saves


def _scan(storage: Storage, spark, key: str, parts: list[dict], schema, target, chosen: dict):
    listed = [(f"{key}/{part['published']}", part["staging"]) for part in parts]
    read = functools.partial(_read_published, storage, listed, target, chosen)
    return spark.range(len(listed), numPartitions=len(listed)).mapInArrow(read, schema)


def _read_published(storage: Storage, parts: list[tuple[str, str]], target, chosen: dict, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor side: the published files whose numbers are in the input (``published_batches``)."""
    for batch in batches:
        for number in batch.column("id").to_pylist():
            yield from published_batches(storage, *parts[number], target, chosen)


def _holds(schema, partition: dict):
    """The condition a partition's rows meet: each partition column equal to its value (or null)."""
    from pyspark.sql import functions as F

    conditions = []
    for column, text in partition.items():
        field = F.col("`" + column.replace("`", "``") + "`")
        value = partitions.python_value(schema[column].dataType.simpleString(), text)
        conditions.append(field.isNull() if value is None else field == F.lit(value))
    return functools.reduce(lambda one, other: one & other, conditions)


def named_in(query: str, stream: str) -> bool:
    """Whether ``query`` can name the stream's view: its text holds the name (identifiers are case-insensitive)."""
    text = query.casefold()
    return stream.casefold() in text or stream.replace("`", "``").casefold() in text


def raw_records(lake: Lake, spark, tap_id: str, streams: list[str], chosen: overrides.Chosen | None = None) -> dict[str, Any]:
    """Every landed record of each stream, exactly typed (or as ``chosen``), with its position columns, and
    its columns (``table_columns``): the values' types are found from the files' statistics (SPEC.md §5),
    and the values of files without them on the executors (one Spark job for all ``streams``, none when
    every file has them), then handed to the data source."""
    from singerlake.replay.plan import needs_on_executors, plan_files
    from singerlake.sources import register
    from singerlake.spark.schema import arrow_schema

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
        frame, types = reader.load(lake.storage.url), (chosen or {}).get(manifest.stream, {})
        if types:
            spark_schema = chosen_spark_schema(frame.schema, types)
            json_columns = [f.name for f in frame.schema.fields if (f.metadata or {}).get("singerlake.json") == "true"]
            target = arrow_schema(spark_schema, spark.conf.get("spark.sql.session.timeZone"))
            convert = {"stream": manifest.stream, "types": types, "json": json_columns}
            frame = frame.mapInArrow(functools.partial(_chosen_batches, convert, target), spark_schema)
        frames[manifest.stream] = (frame, table_columns(replay_schema(manifest).get("properties", {}), needs, types))
    return frames


class SqlSession:
    """One tap's streams as views in one Spark session, for many statements (``singerlake sql`` without
    a query: the shell). Each view is registered once, when a statement first needs it: every
    current-rows view at the first statement (no Spark job: the tables' latest versions are read
    here), or with ``raw`` a stream's view when a statement first names it (its one typing job)."""

    def __init__(self, lake: Lake, spark, tap_id: str | None = None, raw: bool = False, types: dict | list[str] | None = None):
        self.lake, self.spark, self.raw = lake, spark, raw
        self.tap_id = chosen_tap(lake, tap_id)
        self.streams = lake.streams(self.tap_id)
        self.chosen = chosen_types(lake, self.tap_id, self.streams, types)
        self.registered: dict[str, bool] = {}  # stream -> whether it has a view (False: nothing to query yet)
        self.columns: dict[str, list[dict]] = {}  # stream -> its view's columns, marked (``table_columns``)

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
            frames = raw_records(self.lake, self.spark, self.tap_id, wanted, self.chosen) if wanted else {}
        else:
            wanted = [stream for stream in self.streams if stream not in self.registered]
            frames = {stream: self.current(stream) for stream in wanted}
        for stream in wanted:
            frame, self.columns[stream] = frames.get(stream) or (None, [])
            if frame is not None:
                frame.createOrReplaceTempView(view_name(stream))
            self.registered[stream] = frame is not None

    def current(self, stream: str) -> tuple[Any, list[dict]] | None:
        """The stream's current-rows view and its columns (marked: JSON text, chosen types), or None."""
        table = published_table(self.lake.storage, self.lake.manifest(self.tap_id, stream))
        if table is None:
            return None
        types = self.chosen.get(stream, {})
        json_columns = [column["name"] for column in table["columns"] if column["json_text"]]
        frame = current_rows(self.lake, self.spark, self.tap_id, stream, {"stream": stream, "types": types, "json": json_columns})
        marked = {column["name"]: column for column in table["columns"]}
        for name, kind in types.items():
            marked[name] = {**marked.get(name, {"name": name}), "type": kind, "json_text": None, "chosen": kind}
        return frame, list(marked.values())

    def describe(self, stream: str) -> tuple[list[str], list[tuple]]:
        """``\\d NAME``: the view's columns, their types and a comment saying which are JSON text (and why)
        or of a chosen type."""
        columns, rows = self.run(f"DESCRIBE {view_name(stream)}")
        notes = {column["name"]: note(column) for column in self.columns.get(stream, [])}
        return columns, [(name, kind, notes.get(name) or comment) for name, kind, comment in rows]

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
    """The error's line: a value that does not fit its chosen type (raised on an executor) as it was raised."""
    for line in text.splitlines():
        if f"{ProjectionError.__name__}: " in line:
            return line.split(f"{ProjectionError.__name__}: ", 1)[1].strip()
    return (text.strip().splitlines() or ["(no message)"])[0]


def chosen_types(lake: Lake, tap_id: str, streams: list[str], types: dict | list[str] | None) -> overrides.Chosen:
    """The column types chosen for the tap's streams (``--type``), checked against their properties (ConfigError)."""
    if not types:
        return {}
    return overrides.resolve(types, {stream: replay_schema(lake.manifest(tap_id, stream)).get("properties", {}) for stream in streams})


def run_query(
    lake: Lake, spark, query: str, tap_id: str | None = None, raw: bool = False, types: dict | list[str] | None = None
) -> tuple[list[str], list[tuple]]:
    """Register the tap's streams as views and run ``query``: (column names, rows); ``types`` chooses
    column types (``{stream: {column: type}}`` or ``STREAM.COLUMN=TYPE`` texts, SPEC.md §12)."""
    return SqlSession(lake, spark, tap_id, raw, types).run(query)
