"""The tricky stream of the projection tests (SPEC.md §12): values every exact column type must hold, how
to land them, the values a published table must give back, and published values compared as JSON."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

from singerlake.format.exact import decode
from singerlake.tables.delta import table_key, table_uri

from support.lakes import TAP, LakeUnderTest, joined, land, record_msg, schema_msg

STREAM = "public.tricky"
JSONB = {"type": ["string", "number", "integer", "boolean", "array", "object", "null"]}  # how tap-postgres declares jsonb
TRICKY = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "qty.count": {"type": ["number", "null"]},
        "amount": {"type": "number"},
        "big": {"type": "integer"},
        "doc": JSONB,
        "with space €`x": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "integer"}},
        "at": {"type": "string", "format": "date-time"},
        "huge": {"type": "number"},
    },
}
FIRST = [
    '{"id": 1, "qty.count": 1.5, "amount": 12345678901234567890.123456789012345678, "big": 123456789012345678901234567890,'
    ' "doc": "just a string", "with space €`x": "ü", "tags": [1, 2], "at": "2024-05-01T10:00:00+02:00", "huge": 1e400}',
    '{"id": 2, "qty.count": null, "amount": -0.000000000000000001, "big": 1, "doc": "{\\"a\\": 1}", "with space €`x": "",'
    ' "tags": [], "at": "2024-05-01T08:00:00Z", "huge": 0.1}',
    '{"id": 3, "amount": 7, "big": -9223372036854775808, "doc": {"a": 1, "b": [true, null, 2.50]}, "tags": null, "huge": 2}',
]
EXPECTED = {
    1: {
        "qty.count": Decimal("1.5"),
        "amount": Decimal("12345678901234567890.123456789012345678"),
        "big": Decimal("123456789012345678901234567890"),
        "doc": '"just a string"',
        "with space €`x": "ü",
        "tags": [1, 2],
        "at": datetime(2024, 5, 1, 8, tzinfo=timezone.utc),
        "huge": "1E+400",
    },
    2: {"qty.count": None, "amount": Decimal("-1E-18"), "big": Decimal(1), "doc": '"{\\"a\\": 1}"', "with space €`x": "", "tags": []},
    3: {"amount": Decimal(7), "big": Decimal(-(2**63)), "doc": '{"a":1,"b":[true,null,2.50]}', "tags": None, "huge": "2"},
}


def uri(lake: LakeUnderTest, stream: str = STREAM) -> str:
    return table_uri(lake.storage, table_key(TAP, stream))


def land_records(lake: LakeUnderTest, records: list[str], stream: str = STREAM, schema: dict = TRICKY) -> None:
    land(lake.config, joined([schema_msg(stream, schema, ["id"]), *(record_msg(stream, text) for text in records)]))


def by_id(rows: list[dict]) -> dict:
    return {row["id"]: row for row in rows}


def check_exact(rows: dict) -> None:
    assert sorted(rows) == [1, 2, 3]
    for key, expected in EXPECTED.items():
        for column, value in expected.items():
            got = rows[key][column]
            if isinstance(value, datetime):
                got = got.astimezone(timezone.utc)
            assert got == value and type(got) is type(value), (key, column, got, value)


def back_to_json(value, field):
    """A published value as the JSON value it stands for (JSON-text columns decoded)."""
    import pyarrow as pa

    if value is None:
        return None
    if field.metadata and field.metadata.get(b"singerlake.json") == b"true":
        return decode(value)
    if pa.types.is_struct(field.type):  # a missing property and a null are both null (SPEC.md §12)
        return {child.name: back_to_json(value[child.name], child) for child in field.type if value[child.name] is not None}
    if pa.types.is_list(field.type):
        return [back_to_json(item, field.type.value_field) for item in value]
    return value


def same(a, b) -> bool:
    """Equal as JSON values: numbers by value, but a bool is no number and a string no object."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, Decimal)) and isinstance(b, (int, Decimal)):
        return Decimal(a) == Decimal(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
