"""The columnar projection path (#23) gives exactly what ``exact`` gives, value by value.

Arrow's JSON reader types records in bulk (``format/columnar``) and the projection reads a data file's
staging rows in bulk (``tables/staging.bulk_staging_rows``); both fall back to the exact Python path when
they cannot read a value exactly. These tests generate records of every kind, spelled every way JSON
allows (numbers beyond 64 bits, decimals with exponents and trailing zeros, escaped strings, times
with and without offsets, dates that are no dates, values of the wrong kind), and assert that
whenever the fast path answers, its rows and types equal the exact path's.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from singerlake.format.columnar import in_one_strict_form, one_per_line, parse_times, read_lines, typed_texts
from singerlake.format.exact import decode, join_all, parse_date, parse_timestamp, records_needs, typed_table
from singerlake.format.messages import cut_record_lines, decode_record_parts
from singerlake.lake import Lake
from singerlake.spark.session import spark_session
from singerlake.tables.plan import plan_stream
from singerlake.tables.project import project
from singerlake.tables.staging import bulk_staging_rows, file_staging_rows, key_text, key_texts, record_times, staging_schema
from singerlake.times import parse_time_ms
from support.lakes import TAP, joined, land, local_lake_at, ms, record_msg, schema_msg

PROPERTIES = {
    "id": {"type": "integer"},
    "n": {"type": ["number", "null"]},
    "s": {"type": ["string", "null"]},
    "b": {"type": "boolean"},
    "ts": {"type": "string", "format": "date-time"},
    "d": {"type": "string", "format": "date"},
    "tags": {"type": "array", "items": {"type": "integer"}},
    "obj": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "string"}}},
    "name with space.and dot": {"type": "string"},
}


class Num(str):
    """A JSON number spelled exactly as given."""


def to_json(value) -> str:
    if isinstance(value, Num):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=bool(len(str(value)) % 2))  # escaped and unescaped spellings both


integers = st.integers(-(2**70), 2**70).map(lambda n: Num(str(n)))
numbers = st.one_of(
    integers,
    st.decimals(allow_nan=False, allow_infinity=False).map(lambda d: Num(str(d))),
    st.sampled_from(["1.50", "-0.0", "1e5", "2.5E-3", "0.000", "123456789012345678901234567890.5"]).map(Num),
)
offsets = st.sampled_from([timezone.utc, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8)), None])
datetimes = st.builds(lambda dt, tz, sep: dt.replace(tzinfo=tz).isoformat(sep=sep), st.datetimes(), offsets, st.sampled_from(["T", " "]))
times_text = st.one_of(
    datetimes,
    datetimes.map(lambda t: t.replace("+00:00", "Z")),
    st.sampled_from(["2024-01-01", "2024-01-01T10:00", "2024-02-30T00:00:00Z", "not a time", "2024-01-01T10:00:00.1234567Z"]),
)
dates_text = st.one_of(st.dates().map(lambda d: d.isoformat()), st.sampled_from(["2024-02-30", "2024-W01-1", "20240101", "2024-1-1"]))
texts = st.text(max_size=8)
anything = st.recursive(
    st.one_of(st.none(), st.booleans(), integers, texts),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(texts, inner, max_size=2),
)


def of_kind(kind, odd: bool):
    """Values of a kind; with ``odd``, now and then a value of any other kind (the column is then JSON text)."""
    return st.one_of(kind, anything) if odd else kind


def records(odd: bool):
    value = {
        "id": of_kind(integers, odd),
        "n": of_kind(st.one_of(numbers, st.none()), odd),
        "s": of_kind(st.one_of(texts, st.none()), odd),
        "b": of_kind(st.booleans(), odd),
        "ts": of_kind(times_text, odd),
        "d": of_kind(dates_text, odd),
        "tags": of_kind(st.lists(st.one_of(integers, st.none()), max_size=3), odd),
        "obj": of_kind(st.fixed_dictionaries({}, optional={"x": numbers, "y": texts}), odd),
        "name with space.and dot": of_kind(texts, odd),
        "undeclared": anything,
    }
    return st.fixed_dictionaries({}, optional=value)


def exact_and_columnar(lines: list[str], widen: dict | None = None):
    decoded = [decode(line) for line in lines]
    types = join_all([records_needs(PROPERTIES, decoded), widen or {}])
    return typed_table(PROPERTIES, types, decoded), typed_texts(PROPERTIES, types, pa.array(lines, pa.string()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(odd=True), min_size=1, max_size=12))
def test_what_arrow_reads_equals_what_exact_types_whatever_the_values(generated):
    expected, got = exact_and_columnar([to_json(record) for record in generated])
    if got is not None:
        assert got.schema.equals(expected.schema, check_metadata=True)
        assert got.to_pylist() == expected.to_pylist()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(odd=False), min_size=1, max_size=12), st.booleans())
def test_arrow_reads_columns_of_their_kind_exactly_also_under_wider_types(generated, wider):
    lines = [to_json(record) for record in generated]
    decoded = [decode(line) for line in lines]
    needs = records_needs(PROPERTIES, decoded)
    widen = {"n": ["decimal", 25, 9], "id": ["decimal", 30, 0]} if wider and "json" not in (needs["n"], needs["id"]) else None
    expected, got = exact_and_columnar(lines, widen)
    json_columns = [name for name, need in join_all([needs, widen or {}]).items() if need == "json"]
    if not json_columns:  # values of their kind, spelled any way: the fast path answers
        assert got is not None, lines
        assert got.schema.equals(expected.schema, check_metadata=True)
        assert got.to_pylist() == expected.to_pylist()
    else:
        assert got is None, f"JSON-text columns {json_columns} are left to exact"


def test_times_outside_the_strict_form_are_parsed_as_exact_parses_them():
    lines = [
        '{"ts": "2024-01-01T10:00:00"}',  # naive: UTC
        '{"ts": "2024-01-01 10:00:00+02:00"}',  # a space for T
        '{"ts": "2024-01-01"}',  # a date alone
        '{"ts": "2024-01-01T10:00:00.5Z", "d": "2024-W01-1"}',  # an ISO week date
    ]
    expected, got = exact_and_columnar(lines)
    assert got is not None and got.to_pylist() == expected.to_pylist()
    assert [row["ts"].isoformat() for row in got.to_pylist()][:3] == [
        "2024-01-01T10:00:00+00:00",
        "2024-01-01T08:00:00+00:00",
        "2024-01-01T00:00:00+00:00",
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-(2**63), 2**63 - 1), st.none()), min_size=1), st.lists(st.one_of(st.text(), st.none()), min_size=1))
def test_keys_read_in_bulk_are_the_keys_key_text_writes(ints, strings):
    strings = (strings * len(ints))[: len(ints)]
    got = key_texts([pa.array(ints, pa.int64()), pa.array(strings, pa.string())])
    escaped = any(s is not None and any(c in s for c in '"\\') or any(ord(c) < 32 for c in s or "") for s in strings)
    if got is None:
        assert escaped, "only texts JSON escapes leave the bulk path"
    else:
        assert got.to_pylist() == [key_text({"a": i, "b": s}, ["a", "b"]) for i, s in zip(ints, strings, strict=True)]
    assert key_texts([pa.array(ints, pa.int64())]).to_pylist() == [key_text({"a": i}, ["a"]) for i in ints]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(times_text, st.none(), st.just(""), st.integers(0, 5), st.just(Num(""))), min_size=1), st.booleans())
def test_record_times_read_in_bulk_equal_parse_time_ms(values, ascii_only):
    raws = [b"" if value == Num("") else json.dumps(value, ensure_ascii=ascii_only).encode() for value in values]  # Num(""): absent
    expected = [None if value == Num("") else parse_time_ms(value) for value in values]
    assert record_times(raws).to_pylist() == expected


def _one_form(kind: str):
    """Texts all of one strict form of ``kind`` (times: as many fraction digits), one of them perhaps with
    a byte replaced (a letter, a space, another separator, a digit: the form may break or still hold)."""
    if kind == "date":
        spelled = st.lists(st.dates().map(lambda d: d.isoformat()), min_size=1, max_size=6)
    else:
        fractions = st.integers(0, 6)
        spelled = fractions.flatmap(
            lambda k: st.lists(
                st.datetimes().map(lambda t: t.replace(microsecond=0).isoformat() + (f".{t.microsecond:06d}"[: k + 1] if k else "") + "Z"),
                min_size=1,
                max_size=6,
            )
        )
    return st.tuples(spelled, st.integers(0), st.integers(0), st.sampled_from("a :-T.Z5")).map(_replace_one)


def _replace_one(drawn):
    texts, which, at, byte = drawn
    texts = list(texts)
    if which % 3:  # now and then every text stays as made
        index = which % len(texts)
        text = texts[index]
        texts[index] = text[: at % len(text)] + byte + text[at % len(text) + 1 :]
    return texts


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["timestamp", "date"]).flatmap(lambda kind: st.tuples(st.just(kind), _one_form(kind))))
def test_times_checked_all_at_once_are_read_as_exact_reads_them(drawn):
    kind, texts = drawn
    strict = re.compile(r"\d{4}-\d{2}-\d{2}" if kind == "date" else r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z", re.ASCII)
    one_form = all(strict.fullmatch(text) for text in texts) and len({len(text) for text in texts}) == 1
    assert in_one_strict_form(pa.array(texts, pa.string()), kind) == one_form
    quoted = pa.array([f'"{text}"' for text in texts], pa.string())
    assert in_one_strict_form(quoted, kind, b'"') == one_form
    assert in_one_strict_form(pa.array([*texts, None], pa.string()), kind) is False  # a null: not known
    parse = parse_date if kind == "date" else parse_timestamp
    assert parse_times(pa.array(texts, pa.string()), kind).to_pylist() == [parse(text) for text in texts]
    if kind == "timestamp":
        assert record_times([f'"{text}"'.encode() for text in texts]).to_pylist() == [parse_time_ms(text) for text in texts]


@pytest.mark.parametrize(
    ("lines", "parts"),
    [
        (b'{"record":{"a":1}}\n{"record":{"a":2},"version":3}\n', [(b'{"a":1}', b""), (b'{"a":2}', b"3")]),
        (b'{"record":{"a":1}}\n\n{"record":{"a":2}}\n', None),  # a blank line
        (b'{"record":{"a":1}} {"record":{"a":2}}\n', None),  # two values on one line
        (b'{"record":{"a":1}} {"record":{"a":2}}\n\n{"record":{"a":3}}\n', None),  # and a blank line: as many values as lines
        (b'{"record":{"a":1}}\n{"record":', None),  # a line that is no JSON
        (b"\n", []),
    ],
)
def test_record_lines_read_in_one_call_are_one_value_per_line_or_none(lines, parts):
    """The bulk read takes a data file's RECORD lines in one decoder call, and only when each line is
    one value; else (None) the line-by-line read names the line at fault."""
    got = decode_record_parts(lines)
    assert (got if got is None else [(bytes(part.record), bytes(part.version)) for part in got]) == parts


def envelope_line(stream: str, record: str, time: str | None, version: int | None, spaced: bool, order: int) -> bytes:
    """A RECORD line as a tap may spell it: spaced or not, its keys in one of several orders."""
    colon, comma = (": ", ", ") if spaced else (":", ",")
    fields = [("type", '"RECORD"'), ("stream", json.dumps(stream)), ("record", record)]
    fields += [("time_extracted", time)] if time is not None else []
    fields += [("version", str(version))] if version is not None else []
    fields = fields[order % len(fields) :] + fields[: order % len(fields)]
    return ("{" + comma.join(f'"{name}"{colon}{value}' for name, value in fields) + "}\n").encode()


def parts_of(lines: bytes) -> list | None:
    parts = decode_record_parts(lines)
    return None if parts is None else [(bytes(p.record), bytes(p.time_extracted), bytes(p.version)) for p in parts]


def cut_parts(lines: bytes) -> list | None:
    """The cut's parts, when it cuts and Arrow reads every record it cut as one object (as the bulk read does)."""
    cut = cut_record_lines(lines)
    if cut is None:
        return None
    read = read_lines(one_per_line(cut.records), pa.schema([]))
    if read is None or read.num_rows != len(cut.records):
        return None
    times = cut.times.to_pylist()
    return [
        (record.encode(), time.encode(), version)
        for record, time, version in zip(cut.records.to_pylist(), times, cut.versions, strict=True)
    ]


texts = st.text(st.sampled_from('ab{}[]":,\\\n é'), max_size=8)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
strict_times = st.datetimes().map(lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
# (line, bytes from its start or end, bytes replaced, replacement): the envelope is at a line's ends
replacements = st.sampled_from([b"", b'"', b"\\", b"{", b"}", b",", b" ", b"0", b"\n", b":", b"N"])
mutation = st.tuples(st.integers(0, 5), st.integers(-60, 60), st.integers(0, 2), replacements)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    stream=st.sampled_from(["users", 'a "record":{}', "{}", "é\\n"]),
    records=st.lists(st.dictionaries(texts, values, max_size=4), min_size=1, max_size=6),
    times=st.lists(st.one_of(strict_times.map(json.dumps), st.just("null"), st.just('"2024"'), st.none()), min_size=6, max_size=6),
    same_time=st.booleans(),
    version=st.one_of(st.none(), st.integers(-3, 2**70)),
    spaced=st.booleans(),
    order=st.integers(0, 4),
    mutations=st.lists(mutation, max_size=2),
)
def test_record_lines_cut_by_position_give_what_the_decoder_gives(stream, records, times, same_time, version, spaced, order, mutations):
    """Lines that wrap their records alike are cut by position (``cut_record_lines``); whenever the cut
    answers and Arrow reads its records (as the bulk read does), its records, times and version are the
    decoder's, byte for byte, also for lines altered after they were written (a quote, a brace, a
    newline put in or taken out); and lines as singer-sdk writes them are cut."""
    times = [times[0]] * len(records) if same_time else times[: len(records)]
    lines = [envelope_line(stream, to_json(record), time, version, spaced, order) for record, time in zip(records, times, strict=True)]
    data = b"".join(lines)
    if not mutations and same_time and times[0] not in (None, "null") and order == 0:
        assert cut_record_lines(data) is not None  # alike, the time after the record (singer-sdk's order): cut
    for line, before_end, size, text in mutations:  # before_end <= 0: from the line's start
        ends = [index for index, byte in enumerate(data) if byte == ord("\n")] or [len(data)]
        end = ends[line % len(ends)]
        place = max(0, end - before_end) if before_end > 0 else max(0, end - (end - ([-1, *ends][line % len(ends)] + 1)) - before_end)
        data = data[:place] + text + data[place + size :]
    got = cut_parts(data)
    if got is not None:
        assert got == parts_of(data)


HEAD, TAIL = b'{"type":"RECORD","stream":"s","record":', b',"time_extracted":"2024-01-01T00:00:00Z"}\n'


@pytest.mark.parametrize(
    "lines",
    [
        HEAD + b"{}" + TAIL + HEAD + b"  " + TAIL + HEAD + b"{} {}" + TAIL,  # no record, then two: as many as lines
        HEAD + b"{}" + TAIL + HEAD + b'{"a":"}' + TAIL + HEAD + b'{"}' + TAIL,  # a string running into the next record
        HEAD + b"{}" + TAIL + HEAD + b"{}" + TAIL.replace(b"00Z", b'0"Z'),  # a quote in the time
        HEAD.replace(b'"s"', b'"s","version":1') + b"{}" + TAIL + HEAD.replace(b'"s"', b'"s","version":2') + b"{}" + TAIL,  # versions
        HEAD + b"{}" + TAIL + HEAD + b"[]" + TAIL,  # no object
        HEAD + b"{}" + TAIL.replace(b"}", b',"version":1}') + HEAD + b"{}" + TAIL.replace(b"}", b',"version":2}'),  # another version after
    ],
)
def test_record_lines_wrapped_alike_but_no_json_are_not_cut(lines):
    """No cut, as the bulk read takes one (cut by position, then one object a line read by Arrow), answers for these
    lines: they go to the decoder, line by line, whatever it makes of them (some it reads, some it refuses)."""
    assert cut_parts(lines) is None


STREAM = "things"


def tricky_input() -> bytes:
    schema = {"type": "object", "properties": PROPERTIES}
    lines = [schema_msg(STREAM, schema, ["id"])]
    for n in range(60):
        record = {
            "id": n % 45,  # 15 keys updated
            "n": f"{n}.{n % 4}0" if n % 5 else None,
            "s": f"caf\u00e9 {n}",
            "b": n % 2 == 0,
            "ts": f"2024-01-01T00:{n % 60:02d}:00" + ("Z" if n % 3 else ""),
            "d": "2024-02-29",
            "tags": [n, None],
            "obj": {"x": n * 10**25} if n % 7 else {},
            "name with space.and dot": "x",
        }
        if n % 20 == 0:
            record["_sdc_extracted_at"] = f"2024-03-02T00:00:{n:02d}Z"  # the time of a record sent without time_extracted
        text = json.dumps(record, ensure_ascii=n % 2 == 0).replace(f'"{record["n"]}"', str(record["n"]))
        time = None if n % 10 == 0 else f"2024-03-01T00:00:{n:02d}+01:00"
        lines.append(record_msg(STREAM, text, time))
    return joined(lines)


@pytest.mark.parametrize("skip", [0, 7])
def test_a_data_file_read_in_bulk_gives_the_staging_rows_and_types_of_the_line_by_line_read(tmp_path, skip):
    lake_ut = local_lake_at(tmp_path)
    land(lake_ut.config, tricky_input(), batch_max_rows=25)
    lake = Lake(lake_ut.storage)
    plan = plan_stream(lake, TAP, STREAM)
    assert plan.needs is not None and len(plan.files) >= 2, "landed entries carry statistics"
    times = set()
    for file in plan.files:
        file = {**file, "skip": skip}
        typing = (plan.properties, plan.needs)
        bulk = bulk_staging_rows(lake.storage, plan.keys, plan.needs, file, typing)
        assert bulk is not None, "every value here is one the bulk path reads"
        rows = list(file_staging_rows(lake.storage, plan.keys, file))
        times |= {row[4] for row in rows}
        names = staging_schema().names
        assert bulk[0].to_pylist() == [dict(zip(names, row, strict=True)) for row in rows]
        records = [decode(text) for text in bulk[0]["_record"].to_pylist()]
        assert bulk[1].to_pylist() == typed_table(plan.properties, plan.needs, records).to_pylist()
    assert times >= {ms("2024-03-02T00:00:20Z"), ms("2024-03-01T00:00:11+01:00")}, "by _sdc_extracted_at, by time_extracted"
    assert None in times or skip, "a record with neither has no time"


@pytest.fixture(scope="module")
def spark():
    return spark_session("local[2]", "singerlake-tests")


def strip_statistics(lake: Lake) -> None:
    """Entries as written before 2.1 (no ``needs``): the projection then reads and types line by line."""

    def change(current) -> bool:
        current.tail = [{k: v for k, v in e.items() if k not in ("needs", "undeclared")} for e in current.tail]
        return True

    lake.update_manifest(lake.paths(TAP, STREAM), change)


def table_of(root: Path):
    table = DeltaTable(str(root / "published" / TAP / STREAM)).to_pyarrow_table()
    return table.schema, sorted(table.to_pylist(), key=lambda row: row["id"])


def test_a_projection_typed_in_bulk_equals_one_typed_record_by_record_first_and_after_updates(tmp_path, spark):
    (tmp_path / "fast").mkdir()
    (tmp_path / "slow").mkdir()
    fast, slow = local_lake_at(tmp_path / "fast"), local_lake_at(tmp_path / "slow")
    updates = joined([schema_msg(STREAM, {"type": "object", "properties": PROPERTIES}, ["id"])] + [
        record_msg(STREAM, {"id": key, "s": "updated", "ts": "2024-05-01T00:00:00Z", "obj": {"x": 1.25}}) for key in (1, 2, 30)
    ])  # fmt: skip
    for lake_ut in (fast, slow):
        land(lake_ut.config, tricky_input(), batch_max_rows=25)
    strip_statistics(Lake(slow.storage))
    for more in (None, updates):
        for lake_ut in (fast, slow):
            if more:
                land(lake_ut.config, more)
            project(Lake(lake_ut.storage), spark, TAP, part_rows=10)
        schema, rows = table_of(fast.area / "lake")
        assert (schema, rows) == table_of(slow.area / "lake")
        assert len(rows) == 45 and str(schema.field("n").type) == "decimal128(3, 1)"
        files = DeltaTable(str(fast.area / "lake" / "published" / TAP / STREAM)).file_uris()
        # 45 current rows in parts of 10 (ids 15-44, then 0-14 whose updates came last); the updates
        # trim the part of ids 0-9 and the part of 25-34, and their 3 rows join the open last part (10-14)
        assert len(files) == 5
    assert [row["s"] for row in rows if row["id"] in (1, 2, 30)] == ["updated"] * 3
