"""Partitioned tables (SPEC.md §12): a stream's table partitioned by record fields, each by a transform.

Each part holds the rows of one partition, named by its values as the Delta log writes them
(``partition``: column -> text, or None for null). ``identity`` partitions on the property's own
column; ``year``/``month``/``day``/``hour`` add a column ``<field>_<transform>`` whose value is the
same in every row of a part, so it is written from the part's values, never computed row by row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from singerlake.errors import ConfigError
from singerlake.format.errors import ProjectionError
from singerlake.format.exact import decode, json_text
from singerlake.tables.overrides import position_text
from singerlake.times import parse_time_ms

TRANSFORMS = ("identity", "year", "month", "day", "hour")
TAKES = {  # the declared kinds each transform reads
    "identity": ("string", "integer", "number", "boolean", "date", "date-time"),
    "year": ("date", "date-time"),
    "month": ("date", "date-time"),
    "day": ("date", "date-time"),
    "hour": ("date-time",),
}
FORMATS = {"year": "%Y", "month": "%Y-%m", "day": "%Y-%m-%d", "hour": "%Y-%m-%d-%H"}


@dataclass(frozen=True)
class PartitionField:
    field: str  # the record property
    transform: str

    @property
    def column(self) -> str:
        """The table's partition column: the property itself for ``identity``, else a derived one."""
        return self.field if self.transform == "identity" else f"{self.field}_{self.transform}"

    def to_state(self) -> dict:
        return {"field": self.field, "transform": self.transform, "column": self.column}

    @classmethod
    def from_state(cls, state: dict) -> PartitionField:
        return cls(state["field"], state["transform"])


def fields_of(partitioning: list[dict] | None) -> list[PartitionField]:
    return [PartitionField.from_state(entry) for entry in partitioning or []]


def spec_text(partitioning: list[dict] | None) -> str:
    """A spec as the user writes it (``created_at:day,status``), or ``none``."""
    return ",".join(f"{f.field}:{f.transform}" for f in fields_of(partitioning)) or "none"


def declared_kind(schema: dict) -> str | None:
    """The scalar kind a property is declared as (``date-time`` and ``date`` for such strings), else None."""
    kinds = schema.get("type")
    kinds = {kinds} if isinstance(kinds, str) else set(kinds or [])
    kinds.discard("null")
    if len(kinds) != 1 or "anyOf" in schema or "oneOf" in schema:
        return None
    kind = kinds.pop()
    if kind == "string" and schema.get("format") in ("date-time", "date"):
        return schema["format"]
    return kind if kind in ("string", "integer", "number", "boolean") else None


def field_kinds(partitioning: list[dict], properties: dict) -> dict[str, str | None]:
    """Each partition field's declared kind (``declared_kind``), as ``split`` takes them."""
    return {field["field"]: declared_kind(properties[field["field"]]) for field in partitioning}


def parse_spec(stream: str, text: str, properties: dict) -> list[dict]:
    """``FIELD[:TRANSFORM][,...]`` for one stream, checked against its properties (ConfigError names what is at fault)."""
    fields: list[PartitionField] = []
    for item in (piece.strip() for piece in text.split(",")):
        name, _, transform = item.rpartition(":") if ":" in item else (item, "", "identity")
        if not name or transform not in TRANSFORMS:
            transforms = ", ".join(TRANSFORMS)
            raise ConfigError(f"--partition-by {stream}={text}: {item!r} is not FIELD[:TRANSFORM] with a transform of {transforms}")
        if name not in properties:
            raise ConfigError(f"--partition-by {stream}={text}: stream {stream!r} has no property {name!r}")
        kind = declared_kind(properties[name])
        if kind not in TAKES[transform]:
            takes, kind = ", ".join(TAKES[transform]), kind or "none of them"
            raise ConfigError(f"--partition-by {stream}={text}: {transform} takes a property declared {takes}; {name!r} is {kind}")
        field = PartitionField(name, transform)
        if field.transform != "identity" and field.column in properties:
            raise ConfigError(f"--partition-by {stream}={text}: the partition column {field.column!r} is already a property")
        if any(other.column == field.column for other in fields):
            raise ConfigError(f"--partition-by {stream}={text}: {field.column!r} is given twice")
        fields.append(field)
    return [field.to_state() for field in fields]


def resolve(given: dict | list[str] | None, streams: dict[str, dict]) -> dict[str, list[dict]]:
    """``{stream: partitioning}`` from ``{stream: [FIELD[:TRANSFORM], ...]}`` or ``STREAM=FIELD[:TRANSFORM],...``
    texts, for the selected ``streams`` (name -> properties). ConfigError (exit 2) for anything malformed or unknown."""
    if not given:
        return {}
    if isinstance(given, dict):
        pairs = [(stream, ",".join([spec] if isinstance(spec, str) else spec)) for stream, spec in given.items()]
    else:
        pairs = [split_text(text, streams) for text in ([given] if isinstance(given, str) else given)]
    chosen: dict[str, list[dict]] = {}
    for stream, spec in pairs:
        if stream not in streams:
            raise ConfigError(f"--partition-by: no selected stream is named {stream!r}")
        if stream in chosen:
            raise ConfigError(f"--partition-by: stream {stream!r} is given twice")
        chosen[stream] = parse_spec(stream, spec, streams[stream])
    return chosen


def split_text(text: str, streams: dict) -> tuple[str, str]:
    """``STREAM=SPEC``: stream names may hold ``=``, so the split is the one naming a selected stream."""
    splits = [(text[:at], text[at + 1 :]) for at, char in enumerate(text) if char == "="]
    known = [split for split in splits if split[0] in streams]
    if not splits:
        raise ConfigError(f"--partition-by {text}: expected STREAM=FIELD[:TRANSFORM][,FIELD[:TRANSFORM]...]")
    return known[0] if known else splits[0]


# -- rows to partitions ---------------------------------------------------------------------------------
def split(staging, typed, partitioning: list[dict], kinds: dict[str, str]) -> list[tuple[dict, Any, Any]]:
    """``(partition, rows, typed)`` for each partition among staging rows (their typed rows, or None),
    rows in their order. ``kinds``: each field's declared kind (``declared_kind``)."""
    import pyarrow.compute as pc

    fields = fields_of(partitioning)
    texts = [_one_chunk(partition_texts(field, kinds.get(field.field), staging, typed)) for field in fields]
    joined = texts[0] if len(texts) == 1 else pc.binary_join_element_wise(*(pc.fill_null(t, NULL_PART) for t in texts), UNIT)
    return [
        ({field.column: text[first].as_py() for field, text in zip(fields, texts, strict=True)}, rows, typed_rows)
        for first, rows, typed_rows in grouped(staging, typed, joined)
    ]


def grouped(staging, typed, values) -> list[tuple[int, Any, Any]]:
    """``(first, rows, typed)`` for each distinct value of ``values`` (one per row; nulls one group), rows
    in their order; ``first``: the index of the group's first row in ``staging``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    codes = np.asarray(pc.fill_null(pc.dictionary_encode(_one_chunk(values)).indices, -1))
    order = np.argsort(codes, kind="stable")
    starts = [0, *(np.flatnonzero(np.diff(codes[order])) + 1).tolist()] if len(order) else []
    # one take, then a slice per group: a take per group would copy the whole table each time
    take = pa.array(order)
    staging, typed = staging.combine_chunks().take(take), None if typed is None else typed.combine_chunks().take(take)
    return [
        (int(order[start]), staging.slice(start, stop - start), None if typed is None else typed.slice(start, stop - start))
        for start, stop in zip(starts, [*starts[1:], len(order)], strict=True)
    ]


def _one_chunk(array):
    return array.combine_chunks() if hasattr(array, "combine_chunks") else array


NULL_PART, UNIT = "\x00", "\x1f"  # only to group rows by all their fields' values: a null, the values' separator


def partition_texts(field: PartitionField, kind: str | None, staging, typed):
    """Each row's partition value of ``field`` as the Delta log writes it (an Arrow string array, null for
    null): from its typed column when it has one of the field's kind, else from the records."""
    column = typed.column(field.field) if typed is not None and field.field in typed.column_names else None
    texts = None if column is None else _typed_texts(field, column, typed.schema.field(field.field))
    return texts if texts is not None else _record_texts(field, kind, staging)


def _typed_texts(field: PartitionField, column, schema_field):
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if field.transform == "day" and (pa.types.is_timestamp(kind) or pa.types.is_date32(kind)):
        return pc.cast(pc.cast(column, pa.date32()), pa.string())  # as strftime's %Y-%m-%d (UTC), a tenth of its time
    if pa.types.is_timestamp(kind):
        return pc.strftime(column, format=TIME_FORMAT if field.transform == "identity" else FORMATS[field.transform])
    if pa.types.is_date32(kind):
        moments = pc.cast(column, pa.timestamp("s", tz="UTC"))
        return pc.strftime(moments, format="%Y-%m-%d" if field.transform == "identity" else FORMATS[field.transform])
    json_text_column = (schema_field.metadata or {}).get(b"singerlake.json") == b"true"
    scalar = pa.types.is_integer(kind) or pa.types.is_boolean(kind) or pa.types.is_string(kind) or pa.types.is_decimal(kind)
    if field.transform == "identity" and scalar and not json_text_column:
        return pc.cast(column, pa.string())
    return None


TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # Arrow's %S holds the microseconds: the Delta log's timestamp partition value


def _record_texts(field: PartitionField, kind: str | None, staging):
    """``partition_texts`` read from the records' JSON text, one by one (ProjectionError names a value it cannot read)."""
    import pyarrow as pa

    commits, indexes = staging["_singerlake_commit"].to_pylist(), staging["_singerlake_index"].to_pylist()
    values = []
    for row, text in enumerate(staging["_record"].to_pylist()):
        record = decode(text)
        value = record.get(field.field) if isinstance(record, dict) else None
        values.append(value_text(field, kind, value, lambda row=row: position_text(commits[row], indexes[row])))
    return pa.array(values, pa.string())


def value_text(field: PartitionField, kind: str | None, value: Any, where) -> str | None:
    """A record value's partition value as the Delta log writes it; ProjectionError (naming the position
    ``where()`` gives) when the transform cannot read it."""
    if value is None:
        return None
    if field.transform == "identity" and kind not in ("date", "date-time"):
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (str, int, float)) or type(value).__name__ == "Decimal":
            return str(value)
        raise ProjectionError(f"partition column {field.column!r}: {json_text(value)[:40]} at {where()} is no scalar value")
    ms = parse_time_ms(value) if isinstance(value, str) else None
    if ms is None:
        raise ProjectionError(f"partition column {field.column!r}: {json_text(value)[:40]} at {where()} is no date or date-time")
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    if field.transform == "identity":
        return moment.strftime("%Y-%m-%d" if kind == "date" else "%Y-%m-%d %H:%M:%S.%f")
    return moment.strftime(FORMATS[field.transform])


def with_columns(published, partitioning: list[dict] | None, partition: dict | None):
    """A part's published rows with its derived partition columns (its values, in every row): any already there
    replaced. An identity column the table keeps as JSON text (values of mixed kinds) cannot name a partition: ProjectionError."""
    import pyarrow as pa

    for field in fields_of(partitioning):
        if field.transform == "identity":
            metadata = published.schema.field(field.column).metadata or {}
            if metadata.get(b"singerlake.json") == b"true":
                why = "its values are of several kinds (kept as JSON text), so they name no partition"
                raise ProjectionError(f"partition column {field.column!r}: {why}")
            continue
        if field.column in published.column_names:
            published = published.drop_columns([field.column])
        text = (partition or {}).get(field.column)
        kind = derived_type(field.transform)
        value = derived_value(field.transform, text)
        published = published.append_column(pa.field(field.column, kind), pa.array([value] * published.num_rows, kind))
    return published


def derived_value(transform: str, text: str | None) -> Any:
    """A derived column's value from its partition value as the Delta log writes it."""
    return python_value({"year": "int", "day": "date"}.get(transform, "string"), text)


def without_columns(published, partitioning: list[dict] | None):
    """Published rows without their derived partition columns (to be joined with rows typed without them)."""
    derived = [f.column for f in fields_of(partitioning) if f.transform != "identity" and f.column in published.column_names]
    return published.drop_columns(derived) if derived else published


def derived_type(transform: str):
    import pyarrow as pa

    return {"year": pa.int32(), "month": pa.string(), "day": pa.date32(), "hour": pa.string()}[transform]


def schema_with_columns(schema, partitioning: list[dict] | None):
    """The published Arrow schema with the derived partition columns after the properties."""
    import pyarrow as pa

    for field in fields_of(partitioning):
        if field.transform != "identity":
            schema = schema.append(pa.field(field.column, derived_type(field.transform)))
    return schema


def columns(partitioning: list[dict] | None) -> list[str]:
    return [field.column for field in fields_of(partitioning)]


def python_value(kind: str, text: str | None) -> Any:
    """A partition value as the Delta log writes it, as the Python value of its column (``kind``: Spark's type name)."""
    if text is None:
        return None
    if kind == "date":
        return date.fromisoformat(text)
    if kind.startswith("timestamp"):
        return datetime.fromisoformat(text + "+00:00")
    if kind in ("int", "bigint", "smallint", "tinyint"):
        return int(text)
    if kind == "boolean":
        return text == "true"
    if kind.startswith("decimal"):
        return Decimal(text)
    return text
