"""JSON schema -> Spark schema, JSON values -> Python values of those Spark types, Spark -> Arrow schema.

| JSON schema | Spark |
|---|---|
| integer | long (a value outside 64 bits becomes null) |
| number | double |
| boolean | boolean |
| string | string; `format: date-time` -> timestamp, `format: date` -> date (unparsable -> null) |
| object with properties | struct |
| array | array of its items' type |
| anything else (no type, several non-null types, anyOf, free objects) | string holding the value's JSON text (a string keeps its quotes) |

The projection types columns exactly instead (decimals, JSON text for what fits nothing): ``exact``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from decimal import Decimal
from typing import Any

from pyspark.sql import types as T

from singerlake.format.exact import JSON_FIELD, json_text, parse_timestamp

INT64 = (-(2**63), 2**63 - 1)


def _kinds(schema: dict) -> list[str]:
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else list(kind or [])
    return [k for k in kinds if k != "null"]


def spark_type(schema: dict) -> T.DataType:
    kinds = _kinds(schema)
    if len(kinds) != 1 or "anyOf" in schema or "oneOf" in schema:
        return T.StringType()
    kind = kinds[0]
    if kind == "integer":
        return T.LongType()
    if kind == "number":
        return T.DoubleType()
    if kind == "boolean":
        return T.BooleanType()
    if kind == "string":
        return {"date-time": T.TimestampType(), "date": T.DateType()}.get(schema.get("format"), T.StringType())
    if kind == "object" and schema.get("properties"):
        return struct_type(schema)
    if kind == "array" and isinstance(schema.get("items"), dict):
        return T.ArrayType(spark_type(schema["items"]))
    return T.StringType()


def is_json_text(schema: dict) -> bool:
    """Whether ``spark_type`` keeps this schema's values as JSON text (a string column either way)."""
    kinds = _kinds(schema)
    if len(kinds) != 1 or "anyOf" in schema or "oneOf" in schema:
        return True
    return kinds[0] not in ("integer", "number", "boolean", "string") and not (
        (kinds[0] == "object" and schema.get("properties")) or (kinds[0] == "array" and isinstance(schema.get("items"), dict))
    )


def struct_type(schema: dict) -> T.StructType:
    """The properties as fields; a JSON-text one is marked in its metadata as the projection marks it (``JSON_FIELD``)."""
    return T.StructType(
        [
            T.StructField(name, spark_type(spec), metadata=JSON_FIELD if is_json_text(spec) else None)
            for name, spec in schema.get("properties", {}).items()
        ]
    )


def _date(value: Any) -> date | None:
    try:
        return date.fromisoformat(value[:10]) if isinstance(value, str) else None
    except ValueError:
        return None


def _json_text(value: Any) -> str | None:
    return None if value is None else json_text(value)


def _string(value: Any) -> str | None:
    """A declared string as it is; anything else a producer sent in its place as JSON text."""
    return value if isinstance(value, str) or value is None else json_text(value)


def converter(data_type: T.DataType, json_column: bool = False) -> Callable[[Any], Any]:
    """A function turning a decoded JSON value into a value Spark accepts for ``data_type``."""
    if isinstance(data_type, T.LongType):
        return lambda v: v if type(v) is int and INT64[0] <= v <= INT64[1] else None
    if isinstance(data_type, T.DoubleType):
        return lambda v: float(v) if isinstance(v, (int, float, Decimal)) and not isinstance(v, bool) else None
    if isinstance(data_type, T.BooleanType):
        return lambda v: v if isinstance(v, bool) else None
    if isinstance(data_type, T.TimestampType):
        return parse_timestamp
    if isinstance(data_type, T.DateType):
        return _date
    if isinstance(data_type, T.StructType):
        return row_converter(data_type)
    if isinstance(data_type, T.ArrayType):
        item = converter(data_type.elementType)
        return lambda v: [item(x) for x in v] if isinstance(v, list) else None
    return _json_text if json_column else _string


def _is_json_field(field: T.StructField) -> bool:
    return field.metadata.get("singerlake.json") == JSON_FIELD["singerlake.json"]


def row_converter(struct: T.StructType) -> Callable[[Any], tuple | None]:
    fields = [(field.name, converter(field.dataType, _is_json_field(field))) for field in struct.fields]
    return lambda v: tuple(convert(v.get(name)) for name, convert in fields) if isinstance(v, dict) else None


def arrow_schema(struct: T.StructType, timezone: str = "UTC"):
    """The Arrow schema Spark itself uses for ``struct`` in Arrow batches (timestamps labelled ``timezone``,
    Spark's session time zone)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    return pa.schema([pa.field(field.name, to_arrow_type(field.dataType, timezone=timezone)) for field in struct.fields])
