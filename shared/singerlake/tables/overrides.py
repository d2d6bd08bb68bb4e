"""Chosen column types (SPEC.md §12): ``--type STREAM.COLUMN=TYPE`` types one column of a stream's
table as the user says instead of exactly, in ``project`` and ``sql``.

Each value becomes the chosen type by its JSON value: ``double`` rounds to the nearest double,
``decimal(p, s)`` to scale ``s`` (half away from zero, as SQL's CAST), ``string`` takes anything (a
string as itself, any other value as its JSON text); a value that does not fit is an error naming the
column, the value and its position, never a null.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation
from typing import Any

from singerlake.errors import ConfigError
from singerlake.format.errors import ProjectionError
from singerlake.format.exact import INT64, JSON_FIELD, MAX_DIGITS, decode, json_text, json_value, parse_date, parse_timestamp

PLAIN = ("double", "long", "string", "boolean", "timestamp", "date")
DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")
NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")
CHOSEN = "singerlake.type"  # field metadata: the type the user chose
SHOWN = 40  # characters of a value an error shows

Chosen = dict[str, dict[str, str]]  # stream -> column -> type


def type_of(text: str) -> str:
    """The type named by ``text``, in its one spelling (``decimal(10,2)``); ConfigError for any other."""
    name = text.strip().lower()
    if name in PLAIN:
        return name
    found = DECIMAL.fullmatch(name)
    if found and 1 <= int(found[1]) <= MAX_DIGITS and int(found[2]) <= int(found[1]):
        return f"decimal({int(found[1])},{int(found[2])})"
    known = "double, long, decimal(p,s) (p <= 38, s <= p), string, boolean, timestamp or date"
    raise ConfigError(f"--type: unknown type {text!r}; use {known}")


def _splits(target: str, streams: dict[str, dict]) -> list[tuple[str, str]]:
    """The (stream, column) pairs ``target`` may name: a backticked stream, else each ``.`` that leaves a known stream."""
    if target.startswith("`"):
        found = re.fullmatch(r"`((?:[^`]|``)+)`\.(.+)", target)
        return [(found[1].replace("``", "`"), found[2])] if found else []
    return [(target[:at], target[at + 1 :]) for at in range(len(target)) if target[at] == "." and target[:at] in streams]


def resolve(types: dict | Iterable[str] | None, streams: dict[str, dict]) -> Chosen:
    """``{stream: {column: type}}`` from ``--type`` texts (``STREAM.COLUMN=TYPE``) or a dict of that shape,
    checked against ``streams`` (each stream's properties). Anything amiss: ConfigError naming it."""
    chosen: Chosen = {}
    if isinstance(types, dict):
        given = [(stream, column, kind) for stream, columns in types.items() for column, kind in columns.items()]
    else:
        given = [_one(text, streams) for text in types or []]
    for stream, column, kind in given:
        if stream not in streams:
            raise ConfigError(f"--type: no stream {stream!r} (streams: {', '.join(sorted(streams)) or 'none'})")
        if column not in streams[stream]:
            raise ConfigError(f"--type: stream {stream!r} has no column {column!r} (columns: {', '.join(streams[stream])})")
        if column in chosen.get(stream, {}):
            raise ConfigError(f"--type: {stream}.{column} is given twice")
        chosen.setdefault(stream, {})[column] = type_of(kind)
    return chosen


def _one(text: str, streams: dict[str, dict]) -> tuple[str, str, str]:
    target, equals, kind = text.rpartition("=")
    if not equals or not target or not kind.strip():
        raise ConfigError(f"--type {text!r}: expected STREAM.COLUMN=TYPE, e.g. users.score=double")
    splits = _splits(target.strip(), streams)
    fitting = [(stream, column) for stream, column in splits if column in streams.get(stream, {})]
    if len(fitting) > 1:
        raise ConfigError(f"--type {text!r}: ambiguous, quote the stream with backticks (`{fitting[0][0]}`.{fitting[0][1]})")
    if fitting or splits:
        return (*(fitting or splits)[0], kind)
    stream = target.strip().partition(".")[0].strip("`")
    return stream, target.strip()[len(stream) + 1 :], kind


# -- types and schemas ------------------------------------------------------------------------------
def arrow_type(kind: str):
    import pyarrow as pa

    found = DECIMAL.fullmatch(kind)
    if found:
        return pa.decimal128(int(found[1]), int(found[2]))
    plain = {"double": pa.float64(), "long": pa.int64(), "string": pa.string(), "boolean": pa.bool_()}
    return plain.get(kind) or {"timestamp": pa.timestamp("us", tz="UTC"), "date": pa.date32()}[kind]


def chosen_field(name: str, kind: str):
    import pyarrow as pa

    return pa.field(name, arrow_type(kind), metadata={CHOSEN: kind, "comment": f"type chosen: {kind}"})


def chosen_schema(schema, overrides: dict[str, str] | None):
    """The table's Arrow schema with the chosen columns' types."""
    for name, kind in (overrides or {}).items():
        if name in schema.names:
            schema = schema.set(schema.get_field_index(name), chosen_field(name, kind))
    return schema


def is_json_field(field) -> bool:
    return (field.metadata or {}).get(b"singerlake.json") == JSON_FIELD["singerlake.json"].encode()


# -- values -----------------------------------------------------------------------------------------
class _Unfit(Exception):
    """A value that does not fit its chosen type, and why."""


def _number(value: Any) -> int | Decimal:
    if isinstance(value, str) and NUMBER.fullmatch(value.strip()):
        value = decode(value.strip())
    if isinstance(value, bool) or not isinstance(value, int | Decimal) or (isinstance(value, Decimal) and not value.is_finite()):
        raise _Unfit("not a number")
    return value


def _double(value: Any) -> float:
    try:
        number = float(_number(value))
    except OverflowError:
        number = float("inf")
    if number in (float("inf"), float("-inf")):
        raise _Unfit("beyond a double's range")
    return number


def _long(value: Any) -> int:
    number = _number(value)
    if isinstance(number, Decimal):
        if number != number.to_integral_value():
            raise _Unfit("not an integer")
        number = int(number)
    if not INT64[0] <= number <= INT64[1]:
        raise _Unfit("beyond 64 bits")
    return number


def _decimal(precision: int, scale: int) -> Callable[[Any], Decimal]:
    def convert(value: Any) -> Decimal:
        try:
            rounded = Decimal(_number(value)).quantize(Decimal(1).scaleb(-scale), ROUND_HALF_UP, Context(prec=MAX_DIGITS))
        except InvalidOperation:
            raise _Unfit(f"more than {precision - scale} integer digits") from None
        if len(rounded.as_tuple().digits) > precision and rounded != 0:
            raise _Unfit(f"more than {precision - scale} integer digits")
        return rounded

    return convert


def _string(value: Any) -> str:
    return value if isinstance(value, str) else json_text(value)


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Unfit("not true or false")
    return value


def _parsed(parse: Callable[[Any], Any], what: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        parsed = parse(value)
        if parsed is None:
            raise _Unfit(f"not an ISO 8601 {what}")
        return parsed

    return convert


def converter(kind: str) -> Callable[[Any], Any]:
    found = DECIMAL.fullmatch(kind)
    if found:
        return _decimal(int(found[1]), int(found[2]))
    timestamp, date = _parsed(parse_timestamp, "date-time"), _parsed(parse_date, "date")
    return {"double": _double, "long": _long, "string": _string, "boolean": _boolean, "timestamp": timestamp, "date": date}[kind]


def apply(table, overrides: dict[str, str] | None, where: Callable[[int], str], json_columns: Iterable[str] | None = None):
    """``table`` with each chosen column converted (a column of its chosen type already stays). JSON-text
    columns (``json_columns``, else those marked in the schema) are read as the JSON they hold.
    A value that does not fit: ProjectionError naming the column, the value and ``where(row)``."""
    import pyarrow as pa

    json_columns = set(json_columns) if json_columns is not None else {f.name for f in table.schema if is_json_field(f)}
    for name, kind in (overrides or {}).items():
        if name not in table.column_names:
            continue
        index = table.schema.get_field_index(name)
        if (table.schema.field(index).metadata or {}).get(CHOSEN.encode()) == kind.encode():
            continue
        read = decode if name in json_columns else json_value
        convert, values = converter(kind), []
        for row, cell in enumerate(table.column(index).to_pylist()):
            value = None if cell is None else read(cell)
            try:
                values.append(None if value is None else convert(value))
            except _Unfit as unfit:
                shown = json_text(value)
                shown = shown if len(shown) <= SHOWN else shown[: SHOWN - 1] + "…"
                raise ProjectionError(f"column {name!r}: {shown} ({where(row)}) is not a {kind}: {unfit}") from None
        table = table.set_column(index, chosen_field(name, kind), pa.array(values, arrow_type(kind)))
    return table


def position_text(commit: Any, index: Any) -> str:
    return f"commit {commit}, record {index}"


def staging_position(staging: Callable[[], Any]) -> Callable[[int], str]:
    """``where`` for ``apply`` over a part's published rows: the row's position, from its staging rows
    (read only when a value does not fit)."""

    def where(row: int) -> str:
        rows = staging()
        return position_text(rows["_singerlake_commit"][row].as_py(), rows["_singerlake_index"][row].as_py())

    return where


def converted(chosen: dict, rows, where):
    """A view's rows with the columns ``chosen`` names (``{"stream", "types", "json"}``) converted; a value
    that fails is named with its stream and position (``where``)."""
    try:
        return apply(rows, chosen["types"], where, chosen["json"])
    except ProjectionError as exc:
        raise ProjectionError(f"stream {chosen['stream']!r}, {exc}") from None
