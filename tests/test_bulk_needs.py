"""A block's column statistics found in bulk (``format/bulk_needs``) equal those found value by value.

Landing finds each file's statistics (SPEC.md §5) with one typed decoder call per block of RECORD
lines and a check per column; whatever that cannot judge falls back to ``exact``'s value-by-value
needs. These tests generate schemas of every kind (nested objects and lists, nullable and JSON-text
columns) and records of them spelled every way JSON allows (numbers beyond 64 bits, decimals with
exponents and trailing zeros, escaped keys and strings, duplicate keys, times and dates in and out
of their strict forms, undeclared keys, values of the wrong kind), and assert that ``FileNeeds``
gives exactly what the per-value path gives, and that records of their columns' kinds are read in bulk.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from singerlake.format.bulk_needs import BlockNeeds, in_valid_form, numbers_need
from singerlake.format.exact import _number_need, decode, join, parse_date, parse_timestamp
from singerlake.format.needs import FileNeeds, records_of


class Num(str):
    """A JSON number spelled exactly as given."""


class Dup(dict):
    """An object whose first key is written twice: first with ``shadowed``, then with its own value."""

    def __init__(self, items: dict, shadowed):
        super().__init__(items)
        self.shadowed = shadowed


def key_text(key: str, escaped: bool) -> str:
    return '"' + "".join(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else c for c in key) + '"' if escaped else json.dumps(key)


def to_json(value, escape_keys: bool = False) -> str:
    if isinstance(value, Num):
        return str(value)
    if isinstance(value, dict):
        items = [f"{key_text(k, escape_keys)}:{to_json(v, escape_keys)}" for k, v in value.items()]
        if isinstance(value, Dup) and value:
            items.insert(0, f"{key_text(next(iter(value)), escape_keys)}:{to_json(value.shadowed, escape_keys)}")
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_json(v, escape_keys) for v in value) + "]"
    return json.dumps(value, ensure_ascii=bool(len(str(value)) % 2))  # escaped and unescaped spellings both


integers = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**63, -(2**63) - 1, 2**64]),
).map(lambda n: Num(str(n)))
numbers = st.one_of(
    integers,
    st.decimals(allow_nan=False, allow_infinity=False).map(lambda d: Num(str(d))),
    st.decimals(allow_nan=False, allow_infinity=False, places=3).map(lambda d: Num(f"{d:f}")),
    st.sampled_from(
        ["1.50", "-0.0", "0", "-0", "0.000", "0.0e-3", "0e5", "1e5", "2.5E-3", "1E+2", "10.0", "0.0500", "-12.340", "1e400"]
        + ["123456789012345678901234567890.5", "0.00000000000000000000000000000000000001", "9" * 39]
    ).map(Num),
)
offsets = st.sampled_from([timezone.utc, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8)), None])
# (exact.parse_timestamp overflows on times with an offset within a day of year 1 or 9999: not generated)
some_datetimes = st.datetimes(datetime(2, 1, 1), datetime(9998, 12, 31))
datetimes = st.builds(lambda dt, tz, sep: dt.replace(tzinfo=tz).isoformat(sep=sep), some_datetimes, offsets, st.sampled_from(["T", " "]))
strict_times = st.builds(
    lambda dt, digits: dt.strftime("%Y-%m-%dT%H:%M:%S") + (f".{dt.microsecond:06d}"[: digits + 1] if digits else "") + "Z",
    st.datetimes(),
    st.integers(0, 6),
)
times_text = st.one_of(
    datetimes,
    datetimes.map(lambda t: t.replace("+00:00", "Z")),
    strict_times,
    st.sampled_from(["2024-01-01", "2024-02-30T00:00:00Z", "0000-01-01T00:00:00Z", "2023-02-29T00:00:00Z", "2024-02-29T23:59:59Z"]),
    st.sampled_from(["2016-12-31T23:59:60Z", "2024-01-01T24:00:00Z", "2024-13-01T00:00:00Z", "not a time", "2024-01-01T10:00:00.1234567Z"]),
)
dates_text = st.one_of(
    st.dates().map(lambda d: d.isoformat()),
    st.sampled_from(["2024-02-30", "2023-02-29", "2024-02-29", "0000-01-01", "2024-00-10", "2024-W01-1", "20240101", "2024-1-1"]),
)
texts = st.text(max_size=6)
anything = st.recursive(
    st.one_of(st.none(), st.booleans(), integers, numbers, texts),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(texts, inner, max_size=2),
    max_leaves=4,
)
nice_names = st.one_of(
    st.sampled_from(["id", "a", "b", "name with space.and dot", "é", "日本", "x`y", "", "c`` - at `$[0].record"]),
    st.text(st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters='"\\'), max_size=5),
)
names = st.one_of(nice_names, st.sampled_from(['q"', "back\\slash", "\x01"]))  # the latter no field can be named

LEAVES = {
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "string": {"type": "string"},
    "boolean": {"type": "boolean"},
    "date-time": {"type": "string", "format": "date-time"},
    "date": {"type": "string", "format": "date"},
    "email": {"type": "string", "format": "email"},
}
JSON_KINDS = [{}, {"type": ["string", "integer"]}, {"type": "object"}, {"type": "array"}, {"anyOf": [{"type": "string"}]}, True]
leaves = st.one_of(
    st.builds(
        lambda spec, nullable: {**spec, "type": [spec["type"], "null"]} if nullable else spec,
        st.sampled_from(list(LEAVES.values())),
        st.booleans(),
    ),
    st.sampled_from(JSON_KINDS),
)


def schemas(names):
    return st.recursive(
        leaves,
        lambda inner: (
            st.builds(lambda items: {"type": "array", "items": items}, inner)
            | st.builds(
                lambda props: {"type": ["object", "null"], "properties": props}, st.dictionaries(names, inner, min_size=1, max_size=3)
            )
        ),
        max_leaves=6,
    )


def values_of(spec, odd: bool):
    """Values a column declared ``spec`` holds: of its kind (any spelling) or null; with ``odd``, now and then any value."""
    kind = spec.get("type") if isinstance(spec, dict) else None
    kind = [k for k in kind if k != "null"][0] if isinstance(kind, list) and len(kind) == 2 else kind
    fmt = spec.get("format") if isinstance(spec, dict) else None
    if isinstance(spec, dict) and "anyOf" in spec or isinstance(kind, list) or kind is None:
        own = anything
    elif kind == "integer":
        own = integers
    elif kind == "number":
        own = numbers
    elif kind == "boolean":
        own = st.booleans()
    elif kind == "string":
        own = {"date-time": times_text, "date": dates_text}.get(fmt, texts)
    elif kind == "array":
        own = st.lists(values_of(spec["items"], odd), max_size=3) if isinstance(spec.get("items"), dict) else anything
    elif kind == "object" and spec.get("properties"):
        own = objects_of(spec["properties"], odd, extra=odd)
    else:
        own = anything
    own = st.one_of(own, st.none())
    return st.one_of(own, anything) if odd else own


def objects_of(properties: dict, odd: bool, extra: bool):
    """Objects of some of ``properties`` (with ``extra``, now and then an undeclared key), now and then a key written twice."""
    declared = st.fixed_dictionaries({}, optional={name: values_of(spec, odd) for name, spec in properties.items()})
    objects = (
        st.builds(
            lambda d, u: {**d, **{k: v for k, v in u.items() if k not in properties}},
            declared,
            st.dictionaries(names, anything, max_size=2),
        )
        if extra
        else declared
    )

    def twice(d: dict):
        first = next(iter(d), None)
        return st.builds(lambda shadowed: Dup(d, shadowed), values_of(properties[first], odd) if first in properties else anything)

    return st.one_of(objects, objects.filter(bool).flatmap(twice))


def lines_of(records: list, escape_keys: bool, odd_lines: list) -> bytes:
    lines = [
        f'{{"type":"RECORD","stream":"s","record":{to_json(r, escape_keys)},"time_extracted":"2024-01-01T00:00:00Z"}}' for r in records
    ]
    lines += odd_lines
    return "".join(line + "\n" for line in lines).encode()


def by_value(properties: dict, data: bytes) -> FileNeeds:
    found = FileNeeds(properties)
    found.add_records(records_of(data))
    return found


def in_bulk(properties: dict, data: bytes, count: int | None = None) -> FileNeeds:
    found = FileNeeds(properties)
    found.add_lines(data, count)
    return found


blocks = st.dictionaries(names, schemas(names), min_size=1, max_size=5).flatmap(
    lambda properties: st.tuples(
        st.just(properties),
        st.lists(objects_of(properties, odd=True, extra=True), min_size=1, max_size=8),
        st.booleans(),
        st.lists(
            st.sampled_from(['{"type":"RECORD","stream":"s"}', '{"type":"RECORD","stream":"s","record":null}', '{"record":[1]}']),
            max_size=1,
        ),
    )
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(blocks)
def test_statistics_in_bulk_equal_statistics_value_by_value_whatever_the_records(block):
    properties, records, escape_keys, odd_lines = block
    data = lines_of(records, escape_keys, odd_lines)
    expected, got = by_value(properties, data), in_bulk(properties, data)
    assert (got.needs, got.undeclared) == (expected.needs, expected.undeclared)
    assert got.fields() == expected.fields()


plain_blocks = st.dictionaries(nice_names, schemas(nice_names), min_size=1, max_size=5).flatmap(
    lambda properties: st.tuples(
        st.just(properties), st.lists(objects_of(properties, odd=False, extra=False), min_size=1, max_size=8), st.booleans()
    )
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plain_blocks)
def test_records_of_their_columns_kinds_are_read_in_bulk(block):
    """Values of their column's kind, spelled any way, nulls, duplicate keys: the bulk path answers,
    unless an integer column holds one beyond 64 bits (left to ``exact``)."""
    properties, records, escape_keys = block
    data = lines_of(records, escape_keys, [])
    found = BlockNeeds(properties).block_needs(data, len(records))
    expected = by_value(properties, data)
    if found is None:
        assert any(_wide_integer(properties, record) for record in records), data
    else:
        assert found == (expected.needs, expected.undeclared)


def _wide_integer(properties: dict, value) -> bool:
    """Whether ``value`` (an object of ``properties``) holds, somewhere in an integer column, an integer beyond 64 bits."""

    def wide(spec, v) -> bool:
        kind = spec.get("type") if isinstance(spec, dict) else None
        kinds = [kind] if isinstance(kind, str) else [k for k in kind or [] if k != "null"]
        if isinstance(v, Num) and kinds == ["integer"]:
            return not -(2**63) <= int(v) < 2**63
        if isinstance(v, list) and kinds == ["array"] and isinstance(spec.get("items"), dict):
            return any(wide(spec["items"], item) for item in v)
        if isinstance(v, dict) and kinds == ["object"] and spec.get("properties"):
            return _wide_integer(spec["properties"], v)
        return False

    shadowed = [(next(iter(value)), value.shadowed)] if isinstance(value, Dup) and value else []
    return any(name in properties and wide(properties[name], v) for name, v in [*value.items(), *shadowed])


def test_undeclared_keys_are_learned_and_reported_per_block():
    properties = {"id": {"type": "integer"}}
    needs = FileNeeds(properties)
    needs.add_lines(lines_of([{"id": 1, "b": 2}, {"id": 2, "a": None}], False, []), 2)
    needs.add_lines(lines_of([{"id": 3}], False, []), 1)
    needs.add_lines(lines_of([{"id": 4, "c`` - at `$[0].record": 1, "b": 1}], False, []), 1)
    odd = "c`` - at `$[0].record"  # a name msgspec's error message does not tell apart: learned anyway
    assert needs.undeclared == {"a", "b", odd} and needs.fields() == {"needs": {}, "undeclared": ["a", "b", odd]}


def test_a_count_that_is_not_the_lines_is_left_to_exact():
    properties = {"n": {"type": "number"}}
    data = b'{"record":{"n":1}} {"record":{"n":2.5}}\n'
    assert BlockNeeds(properties).block_needs(data, 1) is None
    assert BlockNeeds(properties).block_needs(b'{"record":{"n":1}}\n\n{"record":{"n":2.5}}\n') is None


@given(st.lists(st.one_of(numbers, st.none()), min_size=1, max_size=20))
def test_number_texts_need_what_their_values_need(values):
    texts = b"\n".join(b"null" if v is None else str(v).encode() for v in values)
    expected = None
    for value in values:
        if value is not None:
            expected = join(expected, _number_need("number", decode(str(value))))
    assert numbers_need(texts) == expected


@given(st.lists(st.one_of(strict_times, times_text), min_size=1, max_size=10))
def test_times_checked_at_once_are_times_python_reads(values):
    if in_valid_form(values, "timestamp"):
        assert all(parse_timestamp(value) is not None for value in values)


@given(st.lists(dates_text, min_size=1, max_size=10))
def test_dates_checked_at_once_are_dates_python_reads(values):
    if in_valid_form(values, "date"):
        assert all(parse_date(value) is not None for value in values)
