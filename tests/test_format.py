"""The lake format over real paths: safe segments, schema hashes, data files, metadata, rebuilds.

Every test here goes through the same functions and key layout the tap and target use.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import posixpath
import random
import re
from datetime import datetime, timezone
from pathlib import Path

import farmhash
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from singerlake import Lake, SchemaWriter
from singerlake.changes import log_prefix
from singerlake.errors import UnsafeName
from singerlake.format.datafile import encode, open_data_file, read_data_file, store, summarise, write_data_file
from singerlake.format.errors import CorruptFile, InvalidMetadata
from singerlake.format.layout import DATA_SUFFIX, NAME_FILE, RAW, ROOT_METADATA, DataFileName, StreamPaths
from singerlake.format.manifest import Manifest
from singerlake.format.metadata import blake2_hex, make_record, validate_record
from singerlake.format.names import MAX_SEGMENT_BYTES, decode_segment, encode_segment, is_truncated
from singerlake.format.scan import scan_stream
from singerlake.format.schema_hash import HASH_LENGTH, encode64, is_schema_hash, schema_hash
from singerlake.storage import LocalStorage, PreconditionFailed, S3Storage
from singerlake.storage.base import check_key
from singerlake.times import file_id_ms, new_file_id, parse_time_ms, record_time_ms, to_ms

SEGMENT = re.compile(r"^[a-z0-9_~-]+$")
CROCKFORD = set("0123456789abcdefghjkmnpqrstvwxyz")

LONG_ASCII = "x" * 300
LONG_UNICODE = "ü" * 150 + "名" * 149 + "🦄"  # 300 characters, 1047 UTF-8 bytes
HOSTILE_NAMES = [
    "public.users",
    "Orders",
    "orders",
    "a/b",
    "..",
    ".",
    "...",
    " ",
    "with space",
    " trailing ",
    "straße",
    "名前",
    "emoji 🦄🚀",
    "~",
    "~~",
    "~7e",
    "back\\slash",
    "/abs",
    "../../etc/passwd",
    "nul\x00byte",
    "new\nline",
    "CON",
    "-",
    "_",
    LONG_ASCII,
    LONG_UNICODE,
]

names = st.text(min_size=1, max_size=200)
# Long names sharing a prefix: they all truncate, and only the fingerprint tells them apart.
long_names = st.builds(lambda head, tail: head + tail, st.text(min_size=130, max_size=140), st.text(min_size=1, max_size=20))
any_names = st.one_of(names, long_names)


def assert_safe_segment(segment: str) -> None:
    assert SEGMENT.match(segment), segment
    assert segment not in ("", ".", "..")
    assert len(segment) <= MAX_SEGMENT_BYTES
    assert len(segment.encode("utf-8")) <= MAX_SEGMENT_BYTES
    assert segment == segment.lower()


# ---------------------------------------------------------------------------------------------
# Path safety
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=lambda n: repr(n)[:40])
def test_hostile_names_encode_to_safe_segments(name):
    segment = encode_segment(name)
    assert_safe_segment(segment)
    if is_truncated(segment):
        assert len(name.encode("utf-8")) > MAX_SEGMENT_BYTES // 3
        with pytest.raises(UnsafeName):
            decode_segment(segment)
    else:
        assert decode_segment(segment) == name


def test_long_names_are_truncated():
    assert len(LONG_UNICODE) == 300
    for name in (LONG_ASCII, LONG_UNICODE):
        segment = encode_segment(name)
        assert is_truncated(segment)
        assert_safe_segment(segment)
    assert not is_truncated(encode_segment("x" * MAX_SEGMENT_BYTES))
    assert is_truncated(encode_segment("x" * (MAX_SEGMENT_BYTES + 1)))


def test_hostile_names_are_pairwise_distinct_even_case_folded():
    segments = [encode_segment(n) for n in HOSTILE_NAMES]
    assert len(set(segments)) == len(HOSTILE_NAMES)
    assert len({s.lower() for s in segments}) == len(HOSTILE_NAMES)
    assert len({s.casefold() for s in segments}) == len(HOSTILE_NAMES)
    assert encode_segment("Orders") != encode_segment("orders")
    assert encode_segment("Orders").lower() != encode_segment("orders").lower()


@pytest.mark.parametrize("name", ["", None, 3])
def test_empty_or_non_string_names_are_refused(name):
    with pytest.raises(UnsafeName):
        encode_segment(name)


@given(any_names)
@settings(max_examples=300)
def test_any_name_encodes_to_a_safe_segment(name):
    segment = encode_segment(name)
    assert_safe_segment(segment)
    if not is_truncated(segment):
        assert decode_segment(segment) == name


@given(any_names, any_names)
@settings(max_examples=300)
def test_distinct_names_give_distinct_segments(a, b):
    assume(a != b)
    sa, sb = encode_segment(a), encode_segment(b)
    assert sa != sb
    assert sa.lower() != sb.lower()  # also distinct on case-insensitive filesystems


@given(st.text(min_size=MAX_SEGMENT_BYTES, max_size=150), st.text(min_size=1, max_size=10), st.text(min_size=1, max_size=10))
def test_truncated_names_with_a_common_prefix_stay_distinct(prefix, a, b):
    assume(a != b)
    sa, sb = encode_segment(prefix + a), encode_segment(prefix + b)
    assert is_truncated(sa) and is_truncated(sb)
    assert sa != sb


@given(st.text(min_size=1, max_size=30))
def test_case_variants_stay_distinct(name):
    for other in (name.upper(), name.lower(), name.swapcase()):
        if other != name:
            assert encode_segment(other).lower() != encode_segment(name).lower()


@pytest.mark.parametrize("key", ["../x", "/abs", "a//b", "a/./b", "a/../b", "a/..", "./a", "", "a/", "a\\b", "..", "."])
def test_check_key_rejects_escaping_keys(key):
    with pytest.raises(UnsafeName):
        check_key(key)


def test_check_key_accepts_lake_keys():
    paths = StreamPaths("tap", "users")
    for key in (paths.manifest, paths.catalogue, ROOT_METADATA, paths.lock("0" * HASH_LENGTH)):
        assert check_key(key) == key


@pytest.mark.parametrize("key", ["../x", "/abs", "a//b", "a/./b"])
def test_storages_refuse_escaping_keys(storage, key):
    with pytest.raises(UnsafeName):
        storage.write(key, b"x")
    with pytest.raises(UnsafeName):
        storage.read(key)


def _record_line(stream: str, record: dict) -> bytes:
    return json.dumps({"type": "RECORD", "stream": stream, "record": record}, ensure_ascii=False).encode("utf-8")


def _schema_message(stream: str, schema: dict | None = None, key_properties=("id",)) -> dict:
    schema = schema or {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": ["null", "string"]}}}
    return {"type": "SCHEMA", "stream": stream, "schema": schema, "key_properties": list(key_properties)}


def _all_lake_keys(storage) -> list[str]:
    """Every object the backend holds for this test, relative to the lake root; asserts none is outside it."""
    if isinstance(storage, LocalStorage):
        outside = Path(storage.root).parent
        assert sorted(os.listdir(outside)) == [Path(storage.root).name]
        root = Path(storage.root).resolve()
        keys = []
        for dirpath, _, filenames in os.walk(outside):
            for name in filenames:
                full = Path(dirpath, name).resolve()
                assert full.is_relative_to(root), full
                keys.append(full.relative_to(root).as_posix())
        return sorted(keys)
    assert isinstance(storage, S3Storage)
    keys = []
    for page in storage.client.get_paginator("list_objects_v2").paginate(Bucket=storage.bucket):
        for item in page.get("Contents", []):
            assert item["Key"].startswith(storage.prefix), item["Key"]
            keys.append(item["Key"][len(storage.prefix) :])
    return sorted(keys)


HOSTILE_TAPS = ["../../evil tap", LONG_UNICODE]
HOSTILE_STREAMS = ["public.Users", "public.users", "a/b", "..", ".", "名前 🦄", LONG_ASCII, LONG_UNICODE]


def test_hostile_names_stay_inside_the_lake_and_read_back(storage):
    lake = Lake(storage)
    for tap in HOSTILE_TAPS:
        for stream in HOSTILE_STREAMS:
            with SchemaWriter(lake, tap, _schema_message(stream)) as writer:
                writer.commit([writer.write_file([_record_line(stream, {"id": 1, "name": stream})], [1_700_000_000_000])])

    keys = _all_lake_keys(storage)
    assert keys, "nothing was written"
    inside = (f"{RAW}/", *(log_prefix(tap) for tap in HOSTILE_TAPS))  # the data, and each tap's change log
    for key in keys:
        assert key.startswith(inside), key
        assert posixpath.normpath(key) == key
        assert all(part not in ("", ".", "..") and len(part) <= 255 for part in key.split("/")), key
        assert not key.endswith(".lock"), f"lock left behind: {key}"

    data_keys = [k for k in keys if k.endswith(DATA_SUFFIX)]
    assert len(data_keys) == len(HOSTILE_TAPS) * len(HOSTILE_STREAMS)
    for key in data_keys:
        parsed = DataFileName.parse(key)
        assert parsed.start_ms == parsed.end_ms == 1_700_000_000_000

    def check_names(lake: Lake) -> None:
        assert lake.taps() == sorted(HOSTILE_TAPS)
        assert lake.listed_taps() == sorted(HOSTILE_TAPS)
        for tap in HOSTILE_TAPS:
            assert lake.streams(tap) == sorted(HOSTILE_STREAMS)
            assert lake.listed_streams(tap) == sorted(HOSTILE_STREAMS)
            for stream in HOSTILE_STREAMS:
                manifest = lake.manifest(tap, stream)
                assert (manifest.tap_id, manifest.stream) == (tap, stream)
                assert len(manifest.files) == 1

    check_names(Lake(storage))

    # Truncated segments keep the full name beside them.
    for tap in HOSTILE_TAPS:
        tap_dir = StreamPaths(tap, "_").tap_dir
        if is_truncated(tap_dir.rsplit("/", 1)[1]):
            assert storage.read(f"{tap_dir}/{NAME_FILE}").data.decode("utf-8") == tap
        for stream in (LONG_ASCII, LONG_UNICODE):
            stream_dir = StreamPaths(tap, stream).stream_dir
            assert storage.read(f"{stream_dir}/{NAME_FILE}").data.decode("utf-8") == stream

    # Without any derived metadata, names come back from the directory listing alone.
    storage.delete(ROOT_METADATA)
    for tap in HOSTILE_TAPS:
        storage.delete(StreamPaths(tap, "_").catalogue)
        for stream in HOSTILE_STREAMS:
            storage.delete(StreamPaths(tap, stream).manifest)
    check_names(Lake(storage))


# ---------------------------------------------------------------------------------------------
# Schema hash
# ---------------------------------------------------------------------------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10))
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=5)),
    max_leaves=25,
)
schemas = st.dictionaries(st.text(max_size=8), json_values, min_size=1, max_size=6)
key_props = st.lists(st.text(min_size=1, max_size=6), max_size=3)


def shuffled(value, rnd: random.Random):
    """The same JSON value with the keys of every object, at any depth, in a new order."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


def independent_hash(schema, key_properties) -> str:
    text = json.dumps(
        {"schema": schema, "key_properties": list(key_properties or [])},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    number = farmhash.fingerprint64(text.encode("utf-8"))
    alphabet = "0123456789abcdefghjkmnpqrstvwxyz"
    digits = "".join(alphabet[(number >> (5 * i)) & 31] for i in range(13))
    return digits[::-1]


@given(schemas, key_props, st.randoms(use_true_random=False))
@settings(max_examples=200)
def test_schema_hash_ignores_key_order_at_any_depth(schema, keys, rnd):
    reordered = shuffled(schema, rnd)
    assert reordered == schema
    assert schema_hash(reordered, keys) == schema_hash(schema, keys)


def test_schema_hash_ignores_key_order_in_a_nested_schema():
    a = {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}},
        },
    }
    b = {
        "properties": {
            "tags": {"items": {"maxLength": 3, "type": "string"}, "type": "array"},
            "id": {"minimum": 0, "type": "integer"},
        },
        "type": "object",
    }
    assert list(a) != list(b)
    assert schema_hash(a, ["id"]) == schema_hash(b, ["id"])
    assert schema_hash(a, ["id"]) != schema_hash(a, [])
    assert schema_hash(a) == schema_hash(a, [])


@given(schemas, schemas, key_props)
@settings(max_examples=200)
def test_different_schemas_give_different_hashes(a, b, keys):
    assume(json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True))
    assert schema_hash(a, keys) != schema_hash(b, keys)


@given(schemas, key_props, key_props)
@settings(max_examples=200)
def test_different_key_properties_give_different_hashes(schema, a, b):
    assume(a != b)
    assert schema_hash(schema, a) != schema_hash(schema, b)


@given(schemas, key_props)
@settings(max_examples=200)
def test_schema_hash_is_13_crockford_digits_of_the_canonical_fingerprint(schema, keys):
    value = schema_hash(schema, keys)
    assert len(value) == HASH_LENGTH == 13
    assert set(value) <= CROCKFORD
    assert is_schema_hash(value)
    assert value == independent_hash(schema, keys)


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_encode64_is_a_base32_of_the_whole_64_bits(number):
    text = encode64(number)
    assert len(text) == 13 and set(text) <= CROCKFORD
    assert int(text.translate(str.maketrans("abcdefghjkmnpqrstvwxyz", "abcdefghijklmnopqrstuv")), 32) == number


# ---------------------------------------------------------------------------------------------
# Data files
# ---------------------------------------------------------------------------------------------

TRICKY_LINES = [
    b'{"type":"RECORD","stream":"s","record":{"id":123456789012345678901234567890}}',
    b'{"type": "RECORD", "stream": "s", "record": {"id": 2, "pi": 3.14159265358979323846264338327950288}}',
    '{"type":"RECORD","stream":"s","record":{"id":3,"name":"Zoë 名前 🦄","esc":"\\u00e9\\n"}}'.encode(),
    b'{"type":"RECORD","stream":"s","record":{"id":4,"nested":{"a":[1,{"b":null}],"c":{}},"none":null}}',
    b'{"type":"RECORD","stream":"s","record":{"id":5,"at":"2024-01-01T00:00:00.000000+05:30"},"time_extracted":"2024-01-01T00:00:00.000000+05:30"}',
    b'{ "record" : { "id" : 6.0e0 } , "stream" : "s" , "type" : "RECORD" }',
]
SCHEMA_LINE = (
    b'{"type": "SCHEMA", "stream": "s", "schema": {"type": "object", "properties": {"id": {"type": "number"}}}, "key_properties": ["id"]}'
)


def _schema_hash_of(line: bytes) -> str:
    message = json.loads(line)
    return schema_hash(message["schema"], message.get("key_properties"))


def test_encode_is_reproducible_and_has_no_mtime():
    first = encode(TRICKY_LINES)
    second = encode(list(TRICKY_LINES))
    assert first == second
    assert first[:2] == b"\x1f\x8b"
    assert first[4:8] == b"\x00\x00\x00\x00"  # gzip MTIME
    assert not first[3] & 0x08  # no FNAME
    assert gzip.decompress(first) == b"\n".join(TRICKY_LINES) + b"\n"


def test_write_data_file_keeps_lines_byte_for_byte(storage):
    paths = StreamPaths("tap-x", "s")
    digest = _schema_hash_of(SCHEMA_LINE)
    times = [1_700_000_000_500, 1_600_000_000_000, 1_800_000_000_123, 1_700_000_000_000, 1_650_000_000_001, 1_750_000_000_000]
    record = write_data_file(storage, paths, digest, SCHEMA_LINE, TRICKY_LINES, times, work_id="run-7")

    stored = storage.read(record["path"]).data
    lines = gzip.decompress(stored).split(b"\n")
    assert lines[0] == SCHEMA_LINE
    assert lines[1:-1] == TRICKY_LINES
    assert lines[-1] == b""

    assert record["start"] == min(times) == 1_600_000_000_000
    assert record["end"] == max(times) == 1_800_000_000_123
    assert record["hash"] == hashlib.blake2b(stored, digest_size=16).hexdigest()
    assert record["size"] == len(stored)
    assert record["records"] == len(TRICKY_LINES)
    assert record["schema_hash"] == digest
    assert record["work_id"] == "run-7"
    assert (record["where"], record["what"]) == ("tap-x", "s")
    validate_record(record)

    assert record["path"].startswith(paths.schema_dir(digest) + "/")
    name = DataFileName.parse(record["path"])
    assert name.stream_segment == encode_segment("s")
    assert name.schema_hash == digest
    assert (name.start_ms, name.end_ms) == (record["start"], record["end"])
    assert name.file_id == record["id"]

    summary = summarise(stored, record["path"])
    assert summary.records == len(TRICKY_LINES)
    assert summary.schema_message == json.loads(SCHEMA_LINE)


def test_second_write_with_same_times_never_overwrites(storage):
    paths = StreamPaths("tap", "s")
    digest = _schema_hash_of(SCHEMA_LINE)
    first = write_data_file(storage, paths, digest, SCHEMA_LINE, [TRICKY_LINES[0]], [1_700_000_000_000])
    second = write_data_file(storage, paths, digest, SCHEMA_LINE, [TRICKY_LINES[1]], [1_700_000_000_000])
    assert first["path"] != second["path"]
    assert first["id"] != second["id"]
    a, b = DataFileName.parse(first["path"]), DataFileName.parse(second["path"])
    assert (a.start_ms, a.end_ms) == (b.start_ms, b.end_ms)
    assert gzip.decompress(storage.read(first["path"]).data).split(b"\n")[1] == TRICKY_LINES[0]
    assert gzip.decompress(storage.read(second["path"]).data).split(b"\n")[1] == TRICKY_LINES[1]
    files = [k.key for k in storage.list(paths.schema_dir(digest) + "/")]
    assert sorted(files) == sorted([first["path"], second["path"]])


def test_write_data_file_refuses_empty_or_mismatched_input(storage):
    paths = StreamPaths("tap", "s")
    digest = _schema_hash_of(SCHEMA_LINE)
    with pytest.raises(ValueError):
        write_data_file(storage, paths, digest, SCHEMA_LINE, [], [])
    with pytest.raises(ValueError):
        write_data_file(storage, paths, digest, SCHEMA_LINE, [TRICKY_LINES[0]], [1, 2])
    assert list(storage.list("")) == []


def test_file_ids_are_ordered_by_creation_even_within_a_millisecond():
    ids = [new_file_id() for _ in range(2000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    same_ms = [new_file_id(1_700_000_000_000) for _ in range(200)]
    assert same_ms == sorted(same_ms)
    assert {file_id_ms(i) for i in same_ms} == {1_700_000_000_000}
    for file_id in ids[:10] + same_ms[:10]:
        assert re.fullmatch(r"[0-9a-f]{32}", file_id)
        assert file_id[12] == "7" and file_id[16] in "89ab"  # UUIDv7, RFC 4122 variant


@given(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9999, 12, 30)))
def test_data_file_names_round_trip_any_time(dt):
    ms = to_ms(dt.replace(tzinfo=timezone.utc))
    paths = StreamPaths("t", "a-b-c")
    file_id = new_file_id()
    key = paths.data_file("0123456789abc", ms, ms + 1, file_id)
    assert DataFileName.parse(key) == DataFileName(encode_segment("a-b-c"), "0123456789abc", ms, ms + 1, file_id)


def message_time(message: dict, received: int) -> int | None:
    record = message.get("record")
    return record_time_ms(
        message.get("time_extracted"), lambda: record.get("_sdc_extracted_at") if isinstance(record, dict) else None, received
    )


def test_record_time_prefers_time_extracted_then_sdc_extracted_at_then_receipt():
    received = 1_234_567_890_123
    both = {
        "type": "RECORD",
        "time_extracted": "2024-01-01T00:00:00.000000+05:30",
        "record": {"_sdc_extracted_at": "2023-06-01T12:00:00Z"},
    }
    assert message_time(both, received) == to_ms(datetime(2023, 12, 31, 18, 30, tzinfo=timezone.utc))
    only_sdc = {"type": "RECORD", "record": {"_sdc_extracted_at": "2023-06-01T12:00:00.250Z"}}
    assert message_time(only_sdc, received) == 1_685_620_800_250
    bad_then_sdc = {"type": "RECORD", "time_extracted": "yesterday", "record": {"_sdc_extracted_at": "2023-06-01T12:00:00Z"}}
    assert message_time(bad_then_sdc, received) == 1_685_620_800_000
    naive = {"type": "RECORD", "time_extracted": "2023-06-01T12:00:00"}
    assert message_time(naive, received) == 1_685_620_800_000
    assert message_time({"type": "RECORD", "record": {"id": 1}}, received) == received
    assert message_time({"type": "RECORD", "time_extracted": None, "record": "not a dict"}, received) == received
    assert message_time({"type": "RECORD", "time_extracted": 1_700_000_000}, received) == received
    assert message_time({"type": "RECORD", "record": {"_sdc_extracted_at": "1970-01-01T00:00:00Z"}}, received) == 0


def test_pre_epoch_record_times_do_not_break_the_stream(storage):
    """A tap reporting an extraction time before 1970 must not leave a file no scan can read."""
    received = 1_700_000_000_000
    message = {"type": "RECORD", "stream": "s", "time_extracted": "1960-01-01T00:00:00Z", "record": {"id": 1}}
    time_ms = message_time(message, received)
    assert time_ms >= 0
    paths = StreamPaths("tap", "s")
    digest = _schema_hash_of(SCHEMA_LINE)
    record = write_data_file(storage, paths, digest, SCHEMA_LINE, [json.dumps(message).encode()], [time_ms])
    validate_record(record)
    assert [r["id"] for r in scan_stream(storage, paths).files] == [record["id"]]
    with pytest.raises(ValueError):
        write_data_file(storage, paths, digest, SCHEMA_LINE, [b"{}"], [-1])
    assert [info.key for info in storage.list("")] == [record["path"]]


def test_parse_time_ms_handles_offsets_and_garbage():
    assert parse_time_ms("1970-01-01T00:00:00Z") == 0
    assert parse_time_ms("1970-01-01T00:00:00.001z") == 1
    assert parse_time_ms("1970-01-01T01:00:00+01:00") == 0
    for bad in ("", "nope", None, 5, "2024-13-01T00:00:00Z"):
        assert parse_time_ms(bad) is None


# ---------------------------------------------------------------------------------------------
# Metadata validation
# ---------------------------------------------------------------------------------------------

GOOD_HASH = schema_hash({"type": "object"}, [])


def good_record(**changes) -> dict:
    record = make_record(
        file_id=new_file_id(),
        path="raw/tap/s/x.singer.gz",
        where="tap",
        what="s",
        start=1,
        end=2,
        content_hash="0" * 32,
        size=10,
        records=1,
        schema_hash=GOOD_HASH,
    )
    record.update(changes)
    return record


BAD_RECORDS = [
    ("version", {"version": 1}),
    ("version", {"version": "0"}),
    ("version", {"version": False}),
    ("version", {"version": 0.0}),
    ("id", {"id": "not-a-uuid"}),
    ("id", {"id": "A" * 32}),
    ("id", {"id": 12}),
    ("end", {"start": 5, "end": 4}),
    ("start", {"start": -1}),
    ("start", {"start": True}),
    ("size", {"size": True}),
    ("records", {"records": False}),
    ("records", {"records": 1.5}),
    ("path", {"path": ""}),
    ("where", {"where": "Tap"}),
    ("where", {"where": "public.users"}),
    ("what", {"what": "S"}),
    ("what", {"what": ""}),
    ("work_id", {"work_id": "null"}),
    ("work_id", {"work_id": "Run 1"}),
    ("hash", {"hash": "0" * 31}),
    ("hash", {"hash": "0" * 33}),
    ("hash", {"hash": "G" * 32}),
    ("schema_hash", {"schema_hash": GOOD_HASH[:-1]}),
    ("schema_hash", {"schema_hash": GOOD_HASH[:-1] + "u"}),
]


@pytest.mark.parametrize("field,change", BAD_RECORDS, ids=[f"{f}={c[f]!r}" for f, c in BAD_RECORDS])
def test_validate_record_names_the_bad_field(field, change):
    with pytest.raises(InvalidMetadata, match=f"'{field}'"):
        validate_record(good_record(**change))


@pytest.mark.parametrize(
    "field", ["version", "id", "start", "end", "path", "where", "what", "work_id", "hash", "size", "records", "schema_hash"]
)
def test_validate_record_names_a_missing_field(field):
    record = good_record()
    del record[field]
    with pytest.raises(InvalidMetadata, match=f"'{field}'.*missing"):
        validate_record(record)


def test_validate_record_accepts_good_records():
    validate_record(good_record())
    validate_record(good_record(work_id="run-1", start=3, end=3))
    with pytest.raises(InvalidMetadata):
        validate_record(["not", "a", "dict"])


def manifest_doc(records: list[dict]) -> dict:
    manifest = Manifest("tap", "s")
    manifest.add_version(GOOD_HASH, {"type": "object"}, [], 0)
    manifest.append_commit(records)
    return manifest.to_dict()


def test_manifest_round_trips():
    doc = manifest_doc([good_record(), good_record()])
    manifest = Manifest.from_bytes(json.dumps(doc).encode(), "m.json")
    assert manifest.to_dict() == doc
    assert Manifest.from_bytes(manifest.to_bytes(), "m.json").to_dict() == doc


def _bad_manifests():
    r1, r2 = good_record(), good_record()
    cases = []
    doc = manifest_doc([r1, r2])
    doc["files"][1]["id"] = doc["files"][0]["id"]
    cases.append(("duplicate", "id", doc))
    doc = manifest_doc([r1])
    doc["files"][0]["schema_hash"] = schema_hash({"type": "string"})
    cases.append(("unknown schema", "schema_hash", doc))
    doc = manifest_doc([r1])
    doc["files"][0]["version"] = 2
    cases.append(("file version", "version", doc))
    doc = manifest_doc([r1])
    doc["files"][0]["work_id"] = "null"
    cases.append(("work_id null", "work_id", doc))
    doc = manifest_doc([r1])
    doc["files"][0]["where"] = "TAP"
    cases.append(("upper where", "where", doc))
    doc = manifest_doc([r1])
    del doc["files"][0]["hash"]
    cases.append(("missing hash", "hash", doc))
    doc = manifest_doc([r1])
    doc["files"][0]["end"] = 0
    cases.append(("end before start", "end", doc))
    doc = manifest_doc([r1])
    doc["files"][0]["size"] = True
    cases.append(("bool size", "size", doc))
    doc = manifest_doc([r1])
    doc["files"][0]["commit"] = 5
    cases.append(("commit out of range", "commit", doc))
    doc = manifest_doc([r1])
    doc["commits"] = True
    cases.append(("bool commits", "commits", doc))
    doc = manifest_doc([r1])
    doc["format"] = "other"
    cases.append(("format", "format", doc))
    doc = manifest_doc([r1])
    doc["versions"][GOOD_HASH]["version"] = "one"
    cases.append(("version label", "version", doc))
    doc = manifest_doc([r1])
    doc["versions"]["nothash"] = doc["versions"][GOOD_HASH]
    cases.append(("version key", "nothash", doc))
    doc = manifest_doc([r1])
    doc["versions"][GOOD_HASH]["key_properties"] = "id"
    cases.append(("key_properties", "key_properties", doc))
    doc = manifest_doc([r1])
    del doc["tap_id"]
    cases.append(("tap_id", "tap_id", doc))
    doc = manifest_doc([r1])
    doc["files"] = {}
    cases.append(("files", "files", doc))
    return cases


@pytest.mark.parametrize("label,field,doc", _bad_manifests(), ids=[c[0] for c in _bad_manifests()])
def test_manifest_from_bytes_names_the_bad_field(label, field, doc):
    with pytest.raises(InvalidMetadata) as info:
        Manifest.from_bytes(json.dumps(doc).encode(), "s3://b/raw/tap/s/manifest.json")
    message = str(info.value)
    assert field in message
    assert "s3://b/raw/tap/s/manifest.json" in message


@pytest.mark.parametrize("data", [b"{not json", b"", b"\xff\xfe", b"[1, 2]", b"null"])
def test_manifest_from_bytes_rejects_non_manifests(data):
    with pytest.raises(InvalidMetadata, match="raw/tap/s/manifest.json"):
        Manifest.from_bytes(data, "raw/tap/s/manifest.json")


# ---------------------------------------------------------------------------------------------
# Rebuild (SPEC §7): every piece of metadata can be recovered from the data files
# ---------------------------------------------------------------------------------------------

FILE_FIELDS = ("id", "path", "where", "what", "start", "end", "hash", "size", "records", "schema_hash", "version")


def _write_batches(lake: Lake, tap: str, message: dict, batches: list[list[tuple[dict, int]]], work_id: str) -> None:
    with SchemaWriter(lake, tap, message, work_id=work_id) as writer:
        for batch in batches:
            records = []
            for rows in batch:
                lines = [_record_line(message["stream"], row) for row, _ in rows]
                records.append(writer.write_file(lines, [t for _, t in rows]))
            writer.commit(records)


def test_metadata_is_rebuilt_from_data_files(storage):
    lake = Lake(storage)
    tap, stream, other = "tap-pg", "public.Users", "orders"
    v1 = _schema_message(stream, {"type": "object", "properties": {"id": {"type": "integer"}}})
    v2 = _schema_message(stream, {"type": "object", "properties": {"id": {"type": "integer"}, "email": {"type": "string"}}})
    t0 = 1_700_000_000_000
    _write_batches(
        lake,
        tap,
        v1,
        [
            [[({"id": 1}, t0 + 5), ({"id": 2}, t0)], [({"id": 3}, t0 + 10)]],
            [[({"id": 4}, t0 + 20), ({"id": 5}, t0 + 20), ({"id": 6}, t0 + 21)]],
        ],
        "run-1",
    )
    _write_batches(
        lake,
        tap,
        v2,
        [
            [[({"id": 7, "email": "a@b"}, t0 + 30)], [({"id": 8, "email": "ü@b"}, t0 + 10)]],
            [[({"id": 9, "email": "c"}, t0 + 40)]],
        ],
        "run-2",
    )
    _write_batches(lake, tap, _schema_message(other), [[[({"id": 1}, t0)]]], "run-3")

    paths = StreamPaths(tap, stream)
    original = lake.manifest(tap, stream)
    original_catalogue = lake.catalogue(tap)
    original_root = lake.root_metadata()
    assert storage.exists(paths.manifest) and storage.exists(paths.catalogue) and storage.exists(ROOT_METADATA)
    assert len(original.files) == 6 and len(original.versions) == 2
    assert [v["version"] for v in original.versions.values()] == ["v1", "v2"]
    assert {f["work_id"] for f in original.files} == {"run-1", "run-2"}
    assert lake.streams(tap) == sorted([stream, other])

    for key in (paths.manifest, paths.catalogue, ROOT_METADATA, StreamPaths(tap, other).manifest):
        storage.delete(key)
        assert not storage.exists(key)

    fresh = Lake(storage)
    rebuilt = fresh.manifest(tap, stream)
    assert (rebuilt.tap_id, rebuilt.stream) == (tap, stream)
    assert rebuilt.versions == original.versions
    assert [{k: f[k] for k in FILE_FIELDS} for f in rebuilt.files] == [{k: f[k] for k in FILE_FIELDS} for f in original.files]
    assert all(f["work_id"] is None for f in rebuilt.files)
    assert [f["commit"] for f in rebuilt.files] == list(range(1, 7))
    assert rebuilt.commits == 6
    # The rebuilt manifest is itself a valid manifest.
    assert Manifest.from_bytes(rebuilt.to_bytes(), "rebuilt").to_dict() == rebuilt.to_dict()

    assert fresh.catalogue(tap) == original_catalogue
    assert fresh.root_metadata() == original_root
    assert fresh.taps() == [tap]
    assert fresh.streams(tap) == sorted([stream, other])

    # A writer arriving after the loss rebuilds before committing, so nothing is forgotten.
    _write_batches(fresh, tap, v2, [[[({"id": 10, "email": "d"}, t0 + 50)]]], "run-4")
    after = fresh.manifest(tap, stream)
    assert [f["id"] for f in after.files][:6] == [f["id"] for f in original.files]
    assert len(after.files) == 7
    assert after.versions == original.versions


def test_storing_the_same_bytes_under_a_named_id_twice_is_a_retry_not_a_collision(storage):
    """A Spark task retried after it stored a file writes the same bytes under the same driver-named id."""
    paths = StreamPaths("tap", "users")
    data = encode([b'{"type":"SCHEMA","stream":"users","schema":{},"key_properties":[]}', b'{"type":"RECORD"}'], 6)
    file_id = new_file_id()
    first = store(storage, paths, "4g7wqshytsad9", data, 0, 1, 1, "w", file_id)
    assert store(storage, paths, "4g7wqshytsad9", data, 0, 1, 1, "w", file_id) == first
    with pytest.raises(PreconditionFailed):  # other bytes under that name: a real collision, never overwritten
        store(storage, paths, "4g7wqshytsad9", encode([b"{}"], 6), 0, 1, 1, "w", file_id)
    assert storage.read(first["path"]).data == data


def test_a_data_file_read_whole_equals_its_stream_and_a_damaged_one_is_named(tmp_path):
    """The projection reads a data file in one call (``read_data_file``): the same bytes as the streaming
    reader, every gzip member included; gzip damage behind a matching hash names the file."""
    storage = LocalStorage(tmp_path)
    members = encode([b'{"type":"SCHEMA","stream":"s","schema":{}}']) + encode([b'{"type":"RECORD","stream":"s","record":{"id":1}}'] * 3)
    damaged = members[:-12] + b"garbage-tail"
    for key, data in (("good.singer.gz", members), ("bad.singer.gz", damaged)):
        storage.write(key, data)
    good = {"path": "good.singer.gz", "size": len(members), "hash": blake2_hex(members)}
    with open_data_file(storage, good) as unzipped:
        assert read_data_file(storage, good) == unzipped.read() == gzip.decompress(members)
    with pytest.raises(CorruptFile, match=r"bad\.singer\.gz: corrupt or truncated gzip"):
        read_data_file(storage, {"path": "bad.singer.gz", "size": len(damaged), "hash": blake2_hex(damaged)})
    with pytest.raises(CorruptFile, match=r"good\.singer\.gz: blake2 hash"):
        read_data_file(storage, {**good, "hash": blake2_hex(damaged)})
