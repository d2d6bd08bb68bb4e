"""Exact column types for the projection (SPEC.md §12): JSON schema + the values held -> Arrow types.

Each value says what it **needs** (``need_of``): ``"long"``, ``["decimal", integer_digits, scale]``,
``"bool"``, ``"string"``, ``"timestamp"``, ``"date"``, ``{"struct": {name: need}}``,
``{"list": need}``, ``"json"`` (keep the JSON text) or None (null). Needs join (``join``) over all
the values of a column; ``column_type`` turns the declared schema and the joined need into an Arrow
type. Needs are plain JSON, so a part's needs can be stored with it and joined again later.

Records are decoded with ``decode`` (numbers as ``int`` or ``Decimal``, never float), so every
value keeps its exact digits, and ``json_text`` writes a value back as JSON without losing any.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import msgspec

from singerlake.format.errors import ProjectionError

MAX_DIGITS = 38  # decimal128
INT64 = (-(2**63), 2**63 - 1)
LONG_DIGITS = 19
JSON_FIELD = {"singerlake.json": "true", "comment": "JSON text"}

Need = Any  # see the module docstring


_DECODER = msgspec.json.Decoder(float_hook=Decimal)  # several times faster than json.loads; the same values


def decode(text: str | bytes) -> Any:
    """JSON with exact numbers: integers as int, other numbers as Decimal. What msgspec refuses
    (NaN, lone surrogates) is read as the standard library reads it."""
    try:
        return _DECODER.decode(text)
    except msgspec.DecodeError:
        return json.loads(text, parse_float=Decimal, parse_constant=Decimal)


def json_text(value: Any) -> str:
    """``value`` (as ``decode`` gives it) as compact JSON text; Decimals keep their exact digits."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(json_text(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def json_value(value: Any) -> Any:
    """A value read back from Arrow or Spark as JSON data: structs (rows, dicts) as objects, bytes
    as hex, dates and times as ISO 8601; decimals stay exact (``json_text`` writes their digits)."""
    if hasattr(value, "asDict"):
        return {k: json_value(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return value.hex()
    return value.isoformat() if hasattr(value, "isoformat") else value


# -- what the declared schema says ------------------------------------------------------------------
def _kinds(schema: dict) -> list[str]:
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else list(kind or [])
    return [k for k in kinds if k != "null"]


def declared(schema: dict) -> str:
    """The one kind a column is declared as, or ``json`` when the schema names none or several."""
    kinds = _kinds(schema) if isinstance(schema, dict) else []
    if len(kinds) != 1 or "anyOf" in schema or "oneOf" in schema:
        return "json"
    kind = kinds[0]
    if kind == "string":
        return {"date-time": "timestamp", "date": "date"}.get(schema.get("format"), "string")
    if kind == "object":
        return "struct" if schema.get("properties") else "json"
    if kind == "array":
        return "list" if isinstance(schema.get("items"), dict) else "json"
    return {"integer": "integer", "number": "number", "boolean": "bool"}.get(kind, "json")


# -- what a value needs -----------------------------------------------------------------------------
def need_of(schema: dict, value: Any) -> Need:
    if value is None:
        return None
    kind = declared(schema)
    if kind in ("integer", "number"):
        return _number_need(kind, value)
    if kind == "bool":
        return "bool" if isinstance(value, bool) else "json"
    if kind == "string":
        return "string" if isinstance(value, str) else "json"
    if kind == "timestamp":
        return "timestamp" if parse_timestamp(value) is not None else "json"
    if kind == "date":
        return "date" if parse_date(value) is not None else "json"
    if kind == "struct":
        properties = schema["properties"]
        if not isinstance(value, dict) or not set(value) <= set(properties):
            return "json"
        return _nested({"struct": {name: need_of(properties[name], value.get(name)) for name in properties}})
    if kind == "list":
        if not isinstance(value, list):
            return "json"
        item: Need = None
        for element in value:
            item = join(item, need_of(schema["items"], element))
        return _nested({"list": item})
    return "json"


def _number_need(kind: str, value: Any) -> Need:
    if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
        return "json"
    if isinstance(value, int):
        if kind == "integer" and INT64[0] <= value <= INT64[1]:
            return "long"
        return _decimal(len(str(abs(value))), 0)
    if kind == "integer" or not value.is_finite():
        return "json"
    _, digits, exponent = value.as_tuple()
    digits = list(digits)
    while exponent < 0 and len(digits) > 1 and digits[-1] == 0:  # 1.50 needs scale 1 (no rounding context involved)
        digits.pop()
        exponent += 1
    return _decimal(max(0, len(digits) + exponent), max(0, -exponent))


def _numbers_need(kind: str, values: list[Any]) -> Need:
    """``_number_need`` joined over ``values``, each distinct need joined once."""
    need: Need = None
    seen: set = set()
    for value in values:
        found = _number_need(kind, value)
        key = found if isinstance(found, str) else (found[1], found[2])
        if key not in seen:
            seen.add(key)
            need = join(need, found)
            if need == "json":
                break
    return need


def _decimal(integer_digits: int, scale: int) -> Need:
    return ["decimal", integer_digits, scale] if integer_digits + scale <= MAX_DIGITS else "json"


def join(a: Need, b: Need) -> Need:
    """The least need that holds the values of both."""
    if a is None or a == b:
        return b
    if b is None:
        return a
    if "json" in (a, b):
        return "json"
    if isinstance(a, list) or isinstance(b, list):
        numbers = [n if isinstance(n, list) else ["decimal", LONG_DIGITS, 0] if n == "long" else None for n in (a, b)]
        if None in numbers:
            return "json"
        return _decimal(max(numbers[0][1], numbers[1][1]), max(numbers[0][2], numbers[1][2]))
    if isinstance(a, dict) and isinstance(b, dict):
        if "struct" in a and "struct" in b:
            return _nested({"struct": {name: join(a["struct"].get(name), b["struct"].get(name)) for name in a["struct"] | b["struct"]}})
        if "list" in a and "list" in b:
            return _nested({"list": join(a["list"], b["list"])})
    return "json"


def _nested(need: dict) -> Need:
    """A struct or list with a JSON-text part is JSON text whole: only a column's own metadata can say so."""
    parts = need["struct"].values() if "struct" in need else [need["list"]]
    return "json" if "json" in parts else need


def records_needs(properties: dict[str, dict], records: list[dict]) -> dict[str, Need]:
    """What the values of ``records`` (decoded records) need, per property: one column each."""
    return {name: column_need(spec, [record.get(name) for record in records]) for name, spec in properties.items()}


def column_need(schema: dict, values: list[Any]) -> Need:
    """``need_of`` joined over ``values``; columns of one plain kind (strings, booleans, integers of 64
    bits: most columns) are recognised whole, without a need per value, and lists and objects by the
    columns of their items and properties."""
    present = [value for value in values if value is not None]
    if not present:
        return None
    kind, kinds = declared(schema), {type(value) for value in present}
    if (kind, kinds) in (("string", {str}), ("bool", {bool})):
        return kind
    if kind == "integer" and kinds == {int} and INT64[0] <= min(present) and max(present) <= INT64[1]:
        return "long"
    if kind in ("integer", "number"):
        return _numbers_need(kind, present)
    if kind in ("timestamp", "date"):
        parse = parse_timestamp if kind == "timestamp" else parse_date
        return kind if all(parse(value) is not None for value in present) else "json"
    if kind == "list" and kinds == {list}:
        return _nested({"list": column_need(schema["items"], [item for value in present for item in value])})
    if kind == "struct" and kinds == {dict} and all(value.keys() <= schema["properties"].keys() for value in present):
        return _nested(
            {"struct": {name: column_need(spec, [value.get(name) for value in present]) for name, spec in schema["properties"].items()}}
        )
    need: Need = None
    for value in present:
        need = join(need, need_of(schema, value))
        if need == "json":
            break
    return need


def covers(fixed: Need, need: Need) -> bool:
    """Whether a column typed for ``fixed`` holds values that need ``need`` without losing anything
    (``fixed`` None: the declared type, whose conversion judges each value itself)."""
    if need is None or fixed is None or fixed == "json":
        return True
    if isinstance(fixed, dict) and isinstance(need, dict):
        if "struct" in fixed and "struct" in need:
            return all(covers(fixed["struct"].get(name), child) for name, child in need["struct"].items())
        if "list" in fixed and "list" in need:
            return covers(fixed["list"], need["list"])
        return False
    return join(fixed, need) == fixed


def join_all(needs: list[dict[str, Need]]) -> dict[str, Need]:
    joined: dict[str, Need] = {}
    for part in needs:
        for name, need in part.items():
            joined[name] = join(joined.get(name), need)
    return joined


# -- the column types -------------------------------------------------------------------------------
def column_type(schema: dict, need: Need):
    """The Arrow type of a column declared ``schema`` whose values need ``need``."""
    import pyarrow as pa

    kind = declared(schema)
    if is_json(schema, need):
        return pa.string()
    if kind in ("integer", "number"):
        if need == "long" or (need is None and kind == "integer"):
            return pa.int64()
        integer_digits, scale = (need[1], need[2]) if isinstance(need, list) else (MAX_DIGITS, 0)
        return pa.decimal128(max(1, integer_digits + scale), scale)
    if kind == "struct":
        children = need["struct"] if isinstance(need, dict) else {}
        return pa.struct([field(name, spec, children.get(name)) for name, spec in schema["properties"].items()])
    if kind == "list":
        return pa.list_(column_type(schema["items"], need["list"] if isinstance(need, dict) else None))
    return {"bool": pa.bool_(), "string": pa.string(), "timestamp": pa.timestamp("us", tz="UTC"), "date": pa.date32()}[kind]


def holds_json(schema: dict) -> bool:
    """Whether the declared schema has JSON text anywhere (then the whole column is JSON text)."""
    kind = declared(schema)
    if kind == "struct":
        return any(holds_json(spec) for spec in schema["properties"].values())
    return holds_json(schema["items"]) if kind == "list" else kind == "json"


def is_json(schema: dict, need: Need) -> bool:
    return need == "json" or holds_json(schema)


WHY_JSON = {  # a declared kind whose values need JSON text: what some value must be (SPEC.md §12)
    "integer": "a value is beyond 38 digits or not an integer",
    "number": "a value fits no decimal(38): over 38 significant digits, e.g. 1.5e+300, or not a number",
    "string": "a value is not a string",
    "bool": "a value is not true or false",
    "timestamp": "a value is not an ISO 8601 date-time",
    "date": "a value is not an ISO 8601 date",
    "struct": "a value has keys beyond its properties, or a part of it is JSON text",
    "list": "a value is not an array, or an item is JSON text",
}


def json_why(schema: dict, need: Need) -> str | None:
    """Why a column is JSON text, from its declared schema and need alone (None: it is not)."""
    if holds_json(schema):
        return "its schema gives no single type (no type, several, anyOf/oneOf or a free object)" + (
            "" if declared(schema) == "json" else " somewhere inside"
        )
    return WHY_JSON.get(declared(schema)) if need == "json" else None


def field(name: str, schema: dict, need: Need):
    import pyarrow as pa

    return pa.field(name, column_type(schema, need), metadata=JSON_FIELD if is_json(schema, need) else None)


def table_schema(properties: dict[str, dict], needs: dict[str, Need]):
    """The published table's Arrow schema: one column per stream property, in declared order."""
    import pyarrow as pa

    return pa.schema([field(name, spec, needs.get(name)) for name, spec in properties.items()])


def converter(schema: dict, need: Need) -> Callable[[Any], Any]:
    """A function turning a decoded value into a value of ``column_type(schema, need)``; ``_same`` where
    Arrow takes the decoded value as it is (it rescales a Decimal or an int to the column's scale only
    when nothing is lost, and refuses otherwise)."""
    if is_json(schema, need):
        return lambda v: None if v is None else json_text(v)
    kind = declared(schema)
    if kind == "timestamp":
        return lambda v: None if v is None else parse_timestamp(v)
    if kind == "date":
        return lambda v: None if v is None else parse_date(v)
    if kind == "struct":
        children = need["struct"] if isinstance(need, dict) else {}
        convert = {name: converter(spec, children.get(name)) for name, spec in schema["properties"].items()}
        if all(c is _same for c in convert.values()):  # the need says its keys are properties
            return _same
        return lambda v: None if v is None else {name: c(v.get(name)) for name, c in convert.items()}
    if kind == "list":
        item = converter(schema["items"], need["list"] if isinstance(need, dict) else None)
        return _same if item is _same else lambda v: None if v is None else [item(x) for x in v]
    return _same


def _same(value: Any) -> Any:
    return value


# -- dates and times (as the data source reads them) -------------------------------------------------
def parse_timestamp(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value[:-1] + "+00:00" if value[-1:] in "Zz" else value)
    except ValueError:
        return None
    return parsed.astimezone(timezone.utc) if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def parse_date(value: Any) -> date | None:
    try:
        return date.fromisoformat(value) if isinstance(value, str) and len(value) == 10 else None
    except ValueError:
        return None


def typed_table(properties: dict, types: dict, records: list[dict]):
    """The published rows: one column per property, typed by ``exact``; a failure names its column."""
    import pyarrow as pa

    schema = table_schema(properties, types)
    columns = []
    for name, spec in properties.items():
        convert = converter(spec, types.get(name))
        try:
            values = [record.get(name) for record in records]
            if convert is not _same:  # strings, booleans, 64-bit integers: Arrow takes the values as they are
                values = [convert(value) for value in values]
            columns.append(pa.array(values, column_type(spec, types.get(name))))
        except (pa.ArrowException, ArithmeticError, TypeError, ValueError) as exc:
            raise ProjectionError(f"column {name!r}: {' '.join(str(exc).split())}") from None
    return pa.Table.from_arrays(columns, schema=schema)
