"""target-singerlake end to end: real Spark local mode, real HTTP S3 (moto, SeaweedFS), the real CLI.

In-process runs share one SparkSession (the target's ``getOrCreate``); a few runs go through the
``target-singerlake`` command as a subprocess. Every check reads the lake back from storage, as a
reader would: layout, manifest entries, catalogue, lake metadata, stored bytes, locks, STATE.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import re
import select
import subprocess
import threading
import zlib
from contextlib import redirect_stdout
from pathlib import Path

import msgspec
import pytest
from singer_sdk.exceptions import ConfigValidationError, MissingKeyPropertiesError, RecordsWithoutSchemaException
from singerlake import Lake
from singerlake.format.schema_hash import schema_hash
from singerlake.landing import spark_write
from singerlake.storage import proven
from singerlake.times import now_ms
from support.lakes import (
    CLI,
    ORDERS,
    TAP,
    USERS,
    LakeUnderTest,
    joined,
    land,
    land_failing,
    ms,
    name_ts,
    record_msg,
    run_cli,
    s3_lake_at,
    schema_msg,
    state_msg,
)
from target_singerlake.target import TargetSingerlake

TS = r"\d{8}T\d{6}\.\d{3}Z"
DATA_NAME = re.compile(rf"^(?P<seg>[a-z0-9_~-]+)-(?P<first>{TS})-(?P<last>{TS})-(?P<id>[0-9a-f]{{32}})\.singer\.gz$")
WORK_ID = re.compile(r"^target-singerlake-[0-9a-f]{16}$")


# -- layout, manifest, catalogue, lake metadata ----------------------------------------------------
def test_layout_manifest_catalogue_and_lake_metadata(lake):
    annotations = {
        "owner": "data-team",
        "description": "users and orders from the shop",
        "docs_url": "https://docs.example.com/tap-test",
        "logs_url": "https://ci.example.com/runs/42",
    }
    users_times = ["2024-01-05T10:00:00.250Z", "2024-01-03T09:00:00.000Z", "2024-01-09T00:00:00.999Z", "2024-01-04T00:00:00.001Z"]
    users_times += ["2024-01-02T00:00:00.000Z", "2024-01-07T23:59:59.500Z", "2024-01-06T12:00:00.000Z"]
    orders_times = ["2023-12-31T23:00:00.000Z", "2024-02-01T00:00:00.123Z", "2024-01-15T00:00:00.000Z", "2023-11-30T00:00:00.000Z"]
    orders_times += ["2024-03-01T00:00:00.000Z"]
    lines = [schema_msg("public.users", USERS, ["id"]), schema_msg("Orders", ORDERS)]
    time_of: dict[bytes, int] = {}
    for index in range(max(len(users_times), len(orders_times))):  # interleaved
        if index < len(users_times):
            line = record_msg("public.users", {"id": index, "name": f"user {index}"}, users_times[index])
            lines.append(line)
            time_of[line] = ms(users_times[index])
        if index < len(orders_times):
            line = record_msg("Orders", {"order": f"o-{index}", "total": index * 1.5}, orders_times[index])
            lines.append(line)
            time_of[line] = ms(orders_times[index])
    lines.append(state_msg({"bookmark": 12}))

    states = land(lake.config, joined(lines), batch_max_rows=3, **annotations)
    assert [json.loads(s) for s in states][-1] == {"bookmark": 12}

    sent = {
        "public.users": [line for line in lines if b'"stream":"public.users","record"' in line],
        "Orders": [line for line in lines if b'"stream":"Orders","record"' in line],
    }
    expected = {
        "public.users": ("public~2eusers", "public_users", USERS, ["id"]),
        "Orders": ("~4frders", "orders", ORDERS, []),
    }
    work_ids = set()
    for stream, (segment, what, schema, keys) in expected.items():
        digest = schema_hash(schema, keys)
        assert len(digest) == 13
        manifest = lake.manifest(stream)
        assert manifest["format"] == "singerlake-manifest-v2" and manifest["spec_version"] == "2.0"
        assert (manifest["tap_id"], manifest["stream"]) == (TAP, stream)
        assert list(manifest["versions"]) == [digest]
        version = manifest["versions"][digest]
        assert (version["version"], version["schema"], version["key_properties"]) == ("v1", schema, keys)
        files = manifest["files"]
        assert len(files) >= 2  # batches of 3 rows across two streams: several commits per stream
        assert [entry["commit"] for entry in files] == sorted(entry["commit"] for entry in files)
        assert manifest["commits"] == files[-1]["commit"]
        for entry in files:
            key = entry["path"]
            directory, name = key.rsplit("/", 1)
            assert directory == f"raw/{TAP}/{segment}/{digest}"
            match = DATA_NAME.match(name)
            assert match, name
            assert match["seg"] == segment and match["id"] == entry["id"]
            data = lake.read(key)
            assert entry["hash"] == hashlib.blake2b(data, digest_size=16).hexdigest()
            assert entry["size"] == len(data)
            assert data[4:8] == b"\0\0\0\0"  # gzip mtime 0: same bytes for the same messages
            file_lines = lake.file_lines(key)
            assert file_lines[0] == (lines[0] if stream == "public.users" else lines[1])  # the SCHEMA as received
            records = file_lines[1:]
            assert entry["records"] == len(records)
            assert entry["start"] == min(time_of[r] for r in records)
            assert entry["end"] == max(time_of[r] for r in records)
            assert (match["first"], match["last"]) == (name_ts(entry["start"]), name_ts(entry["end"]))
            assert (entry["where"], entry["what"], entry["version"], entry["schema_hash"]) == (TAP, what, 0, digest)
            assert WORK_ID.match(entry["work_id"])
            work_ids.add(entry["work_id"])
        assert lake.stored(stream) == sent[stream]
    assert len(work_ids) == 1  # one run, one work id

    # Nothing but manifests, catalogue, lake metadata and committed data files; no lock left.
    committed = {entry["path"] for stream in expected for entry in lake.manifest(stream)["files"]}
    assert set(lake.data_keys()) == committed
    assert lake.locks() == []
    assert set(lake.keys()) == committed | {
        "raw/singerlake.json",
        f"raw/{TAP}/catalogue.json",
        f"raw/{TAP}/public~2eusers/manifest.json",
        f"raw/{TAP}/~4frders/manifest.json",
    }

    catalogue = lake.json(f"raw/{TAP}/catalogue.json")
    assert [entry["tap_stream_id"] for entry in catalogue["streams"]] == ["Orders", "public.users"]
    for entry in catalogue["streams"]:
        segment, _, schema, keys = expected[entry["tap_stream_id"]]
        assert entry["schema"] == schema and entry["key_properties"] == keys
        meta = entry["metadata"][0]
        assert meta["breadcrumb"] == []
        assert meta["metadata"]["singerlake-schema-hash"] == schema_hash(schema, keys)
        assert meta["metadata"]["singerlake-version"] == "v1"
        assert meta["metadata"]["singerlake-path"] == f"raw/{TAP}/{segment}"
        assert meta["metadata"]["table-key-properties"] == keys

    root = lake.json("raw/singerlake.json")
    assert root["format"] == "singerlake" and root["spec_version"] == "2.0"
    assert root["taps"] == {TAP: {"path": f"raw/{TAP}", **annotations}}


# -- lossless ------------------------------------------------------------------------------------
LOSSLESS_RECORDS = [
    '{"id":1,"big":123456789012345678901234567890,"neg_big":-98765432109876543210987654321}',
    '{"id":2,"dec":1234567890.123456789012345678901234567890,"tiny":1e-7,"tenth":0.1,"exp":6.02E+23,"zero":-0.0,"x":1.50}',
    '{"id":3,"text":"naïve café — 名前 🦄","escaped":"\\u00e9\\ud83e\\udd84 \\"quoted\\" back\\\\slash \\/ tab\\t nl\\n"}',
    '{"id":4,"nested":{"a":[1,{"b":null,"c":[[],{}]}],"deep":{"x":{"y":{"z":"zz"}}}},"empty":{},"list":[]}',
    '{"id":5,"nothing":null,"yes":true,"no":false}',
    '{"id":6,"date":"2024-02-29T23:59:59.999999+05:30","day":"2024-02-29","when":"2024-01-01T00:00:00-08:00"}',
    '{ "id" : 7 ,  "spaced" : [ 1 , 2 ] , "z_first_a_last": 1, "a": 2 }',
    '{"id":8,"dup":1,"dup":2}',
]


def test_records_are_stored_byte_for_byte(lake):
    schema = {"type": "object", "properties": {"id": {"type": "integer"}}}
    lines = [
        b'{"type": "SCHEMA", "stream": "things", "schema": {"type": "object", "properties": {"id": {"type": "integer"}}},'
        b' "key_properties": ["id"]}'
    ]
    lines += [record_msg("things", text, "2024-03-01T00:00:00.000Z") for text in LOSSLESS_RECORDS]
    lines.append(b'{"record": {"id": 9, "order": "envelope keys reordered"}, "stream": "things", "type": "RECORD", "version": 3}')
    lines.append(b'{"type":"RECORD","stream":"things","record":{"id":10},"time_extracted":"2024-03-01T02:00:00+02:00"}')
    state = '{"offset": 123456789012345678901234567890, "cursor": "名前", "f": 0.1}'
    lines.append(state_msg(state))
    lines.append(record_msg("things", '{"id":11,"last":"line without a final newline"}', "2024-03-01T00:00:00.000Z"))

    states = land(lake.config, joined(lines, final_newline=False))

    records = [line for line in lines if b'"RECORD"' in line]
    assert lake.stored("things") == records
    first_line = lake.file_lines(lake.manifest("things")["files"][0]["path"])[0]
    assert first_line == lines[0]  # the SCHEMA line too, exactly as received
    # STATE values are passed on exactly as received, too (big ints, unicode, spacing).
    assert states == [state]
    assert lake.manifest("things")["versions"][schema_hash(schema, ["id"])]["version"] == "v1"
    # The record with a +02:00 offset is filed under its UTC time.
    assert lake.manifest("things")["files"][0]["start"] == ms("2024-03-01T00:00:00.000Z")
    assert lake.locks() == []


# -- schema changes ------------------------------------------------------------------------------
def test_schema_change_mid_stream_makes_a_new_version_in_order(lake):
    v1 = {"type": "object", "properties": {"id": {"type": "integer"}}}
    v2 = {"type": "object", "properties": {"id": {"type": "integer"}, "email": {"type": "string"}}}
    v1_reordered = {"properties": {"id": {"type": "integer"}}, "type": "object"}  # the same schema
    lines = [schema_msg("users", v1, ["id"])]
    lines += [record_msg("users", {"id": i}, f"2024-01-01T00:00:0{i}.000Z") for i in range(1, 4)]
    lines.append(schema_msg("users", v2, ["id"]))
    lines += [record_msg("users", {"id": i, "email": f"{i}@x"}, f"2024-01-01T00:00:0{i}.000Z") for i in range(4, 7)]
    lines.append(schema_msg("users", v2, ["id"]))  # identical: nothing changes
    lines += [record_msg("users", {"id": 7, "email": "7@x"}, "2024-01-01T00:00:07.000Z")]
    lines.append(schema_msg("users", v1_reordered, ["id"]))  # back to v1's hash: records go to v1 again
    lines += [record_msg("users", {"id": 8}, "2024-01-01T00:00:08.000Z")]
    lines.append(state_msg({"done": True}))

    states = land(lake.config, joined(lines))

    assert states == ['{"done": true}']
    h1, h2 = schema_hash(v1, ["id"]), schema_hash(v2, ["id"])
    assert h1 != h2
    manifest = lake.manifest("users")
    assert {h: info["version"] for h, info in manifest["versions"].items()} == {h1: "v1", h2: "v2"}
    assert manifest["versions"][h2]["schema"] == v2
    files = manifest["files"]
    assert [entry["schema_hash"] for entry in files] == [h1, h2, h1]
    assert [entry["records"] for entry in files] == [3, 4, 1]
    assert [entry["path"].split("/")[3] for entry in files] == [h1, h2, h1]
    assert lake.stored("users") == [line for line in lines if b'"RECORD"' in line]
    # Each file starts with the SCHEMA of its directory.
    assert json.loads(lake.file_lines(files[1]["path"])[0])["schema"] == v2
    assert json.loads(lake.file_lines(files[2]["path"])[0])["schema"] == v1_reordered
    # The catalogue holds the latest version (by number): v2.
    entry = lake.json(f"raw/{TAP}/catalogue.json")["streams"][0]
    assert entry["schema"] == v2
    assert entry["metadata"][0]["metadata"]["singerlake-version"] == "v2"
    assert lake.locks() == []


def test_identical_schema_repeated_changes_nothing(local_lake):
    lake = local_lake
    lines = [schema_msg("s", USERS, ["id"]), record_msg("s", {"id": 1}, "2024-01-01T00:00:00.000Z")]
    lines += [schema_msg("s", USERS, ["id"]), record_msg("s", {"id": 2}, "2024-01-01T00:00:01.000Z")]
    lines += [json.dumps({"type": "SCHEMA", "stream": "s", "key_properties": ["id"], "schema": dict(reversed(USERS.items()))}).encode()]
    lines += [record_msg("s", {"id": 3}, "2024-01-01T00:00:02.000Z")]

    land(lake.config, joined(lines))

    manifest = lake.manifest("s")
    assert list(manifest["versions"]) == [schema_hash(USERS, ["id"])]
    assert len(manifest["files"]) == 1 and manifest["files"][0]["records"] == 3
    assert lake.storage.list_dirs(f"raw/{TAP}/s/") == [schema_hash(USERS, ["id"])]


def test_a_large_segment_split_over_several_files_keeps_record_order_in_one_commit(local_lake):
    """About 20 MiB of one stream: several chunks and Spark partitions, each a file, all in one commit."""
    lake = local_lake
    pad = "x" * 1000
    lines = [schema_msg("big", USERS, ["id"])]
    times = [f"2024-01-01T00:{n // 60 % 60:02d}:{n % 60:02d}.000Z" for n in range(20_000)]
    lines += [record_msg("big", f'{{"id":{n},"pad":"{pad}"}}', times[n]) for n in range(20_000)]

    land(lake.config, joined(lines), max_file_bytes=1)

    files = lake.manifest("big")["files"]
    assert len(files) >= 2
    assert {entry["commit"] for entry in files} == {1}
    assert sum(entry["records"] for entry in files) == 20_000
    assert lake.stored("big") == lines[1:]


def gzip_members(data: bytes) -> int:
    count = 0
    while data:
        unzip = zlib.decompressobj(31)
        unzip.decompress(data)
        assert unzip.eof, "truncated gzip member"
        data, count = unzip.unused_data, count + 1
    return count


def test_data_files_are_gzip_members_that_the_gzip_command_reads_whole(local_lake):
    """The driver gzips ~1 MiB chunks; a file is its SCHEMA member followed by chunk members (§4)."""
    lake = local_lake
    lines = [schema_msg("wide", USERS, ["id"])]
    lines += [record_msg("wide", f'{{"id":{n},"pad":"{n:0>300}"}}', "2024-01-01T00:00:00.000Z") for n in range(12_000)]

    land(lake.config, joined(lines))

    files = lake.manifest("wide")["files"]
    unzipped = []
    for entry in files:
        stored = lake.read(entry["path"])
        assert gzip_members(stored) >= 2
        text = subprocess.run(["gzip", "-dc"], input=stored, check=True, capture_output=True).stdout
        assert text.split(b"\n")[0] == lines[0]
        unzipped += text.splitlines()[1:]
    assert sum(gzip_members(lake.read(entry["path"])) for entry in files) >= len(files) + 3  # 3.7 MiB, ~1 MiB chunks
    assert unzipped == lines[1:]


def test_chunks_waiting_for_gzip_are_bounded_so_fast_input_cannot_pile_up_raw_text(monkeypatch):
    """With one gzip thread stuck, the reader may hand over two chunks; the third waits for them."""
    unblock = threading.Event()

    def stuck_gzip(data, level):
        unblock.wait(30)
        return gzip.compress(bytes(data), level, mtime=0)

    monkeypatch.setattr(spark_write, "gzip_member", stuck_gzip)
    compressor = spark_write.ChunkCompressor(6, threads=1)
    a, b, c = (letter * spark_write.INLINE_GZIP_BYTES + b"\n" for letter in (b"a", b"b", b"c"))  # large enough for the pool
    chunks = [compressor.chunk(a, 1, 0, 0), compressor.chunk(b, 1, 0, 0)]
    third = threading.Thread(target=lambda: chunks.append(compressor.chunk(c, 1, 0, 0)))
    third.start()
    third.join(0.5)
    assert third.is_alive() and len(chunks) == 2  # the reader waits instead of queueing more raw text
    unblock.set()
    third.join(30)
    assert [gzip.decompress(chunk.member.result()) for chunk in chunks] == [a, b, c]
    compressor.close()


# -- STATE after commit --------------------------------------------------------------------------
def test_state_is_emitted_only_after_the_records_before_it_are_committed(lake):
    """With small batches, each STATE line must find every record sent before it in the manifests."""
    lines = [schema_msg("a", USERS, ["id"]), schema_msg("b", USERS, ["id"])]
    sent_before: dict[str, dict[str, int]] = {}
    counts = {"a": 0, "b": 0}
    for n in range(1, 15):
        stream = "a" if n % 3 else "b"
        lines.append(record_msg(stream, {"id": n}, f"2024-01-01T00:00:{n:02d}.000Z"))
        counts[stream] += 1
        lines.append(state_msg({"n": n}))
        sent_before[json.dumps({"n": n})] = dict(counts)

    target = TargetSingerlake(config={**lake.config, "batch_max_rows": 4})
    seen: list[tuple[str, dict[str, list[bytes]]]] = []
    emit = target.lander.drain.emit_state

    def watching_emit(state: bytes) -> None:
        committed = {s: lake.stored(s) if lake.has_manifest(s) else [] for s in ("a", "b")}
        seen.append((state.decode(), committed))
        emit(state)

    target.lander.drain.emit_state = watching_emit
    out = io.StringIO()
    with redirect_stdout(out):
        target.listen(file_input=io.BytesIO(joined(lines)))

    records = {s: [line for line in lines if f'"stream":"{s}","record"'.encode() in line] for s in ("a", "b")}
    assert [line for line in out.getvalue().splitlines() if line] == [state for state, _ in seen]
    assert len(seen) >= 3  # states are emitted as batches commit, not only at the end
    numbers = [json.loads(state)["n"] for state, _ in seen]
    assert numbers == sorted(set(numbers))  # in order, no duplicates
    assert numbers[-1] == 14  # the final STATE is the last one received
    for state, committed in seen:
        for stream in ("a", "b"):
            before = sent_before[state][stream]
            assert committed[stream][:before] == records[stream][:before], (state, stream)
    assert lake.stored("a") == records["a"] and lake.stored("b") == records["b"]
    assert lake.locks() == []


def test_every_state_is_emitted_in_order_when_batches_are_cut_at_each_state(local_lake):
    """max_batch_age_seconds=0: every STATE cuts the batch, so each one is emitted, after its records."""
    lake = local_lake
    lines = [schema_msg("a", USERS, ["id"]), schema_msg("b", USERS, ["id"])]
    expected_states = []
    for n in range(1, 6):
        lines += [record_msg("a", {"id": n}), record_msg("b", {"id": n})]
        expected_states.append(json.dumps({"a": n, "b": n}))
        lines.append(state_msg(expected_states[-1]))
    lines.append(record_msg("a", {"id": 99}))  # after the last STATE: landed at the end

    target = TargetSingerlake(config={**lake.config, "max_batch_age_seconds": 0})
    committed_at_state = []
    emit = target.lander.drain.emit_state

    def watching_emit(state: bytes) -> None:
        committed_at_state.append(len(lake.stored("a")) if lake.has_manifest("a") else 0)
        emit(state)

    target.lander.drain.emit_state = watching_emit
    out = io.StringIO()
    with redirect_stdout(out):
        target.listen(file_input=io.BytesIO(joined(lines)))
    assert out.getvalue().splitlines() == expected_states
    assert committed_at_state == [1, 2, 3, 4, 5]
    assert len(lake.stored("a")) == 6 and len(lake.stored("b")) == 5


# -- record times --------------------------------------------------------------------------------
def test_record_time_falls_back_to_sdc_extracted_at_then_receive_time(local_lake):
    lake = local_lake
    lines = [schema_msg("with_sdc", USERS), schema_msg("bare", USERS), schema_msg("timed", USERS)]
    lines.append(record_msg("with_sdc", '{"id":1,"_sdc_extracted_at":"2023-05-01T10:00:00.123Z"}'))
    lines.append(record_msg("bare", '{"id":1}'))
    lines.append(record_msg("timed", '{"id":1,"_sdc_extracted_at":"2001-01-01T00:00:00Z"}', "2022-02-02T02:02:02.202Z"))
    lines.append(record_msg("with_sdc", '{"id":2,"_sdc_extracted_at":"2023-05-02T10:00:00+01:00"}'))
    lines.append(record_msg("bare", '{"id":2}'))

    before = now_ms()
    land({**lake.config, "lake_root": Path(lake.config["lake_root"]).as_uri()}, joined(lines))  # a file:// root
    after = now_ms()

    (with_sdc,) = lake.manifest("with_sdc")["files"]
    assert (with_sdc["start"], with_sdc["end"]) == (ms("2023-05-01T10:00:00.123Z"), ms("2023-05-02T09:00:00.000Z"))
    (timed,) = lake.manifest("timed")["files"]  # time_extracted wins over _sdc_extracted_at
    assert timed["start"] == timed["end"] == ms("2022-02-02T02:02:02.202Z")
    (bare,) = lake.manifest("bare")["files"]
    assert before <= bare["start"] <= bare["end"] <= after
    assert DATA_NAME.match(bare["path"].rsplit("/", 1)[1])["first"] == name_ts(bare["start"])


# -- BATCH and ACTIVATE_VERSION ----------------------------------------------------------------------
def test_batch_messages_are_landed_like_records(lake, tmp_path):
    batch_records = [
        b'{"id":101,"big":123456789012345678901234567890,"_sdc_extracted_at":"2024-04-01T00:00:00.000Z"}',
        '{"id":102,"text":"名前 🦄","dec":0.1000000000000000000000000000000000000001,"_sdc_extracted_at":"2024-04-02T06:00:00Z"}'.encode(),
    ]
    plain_records = [b'{"id":103,"nested":{"a":[1,null]},"_sdc_extracted_at":"2024-04-03T00:00:00.000Z"}']
    gz_file = tmp_path / "batch-0001.jsonl.gz"
    gz_file.write_bytes(gzip.compress(b"\n".join(batch_records) + b"\n"))
    plain_file = tmp_path / "batch 0002.jsonl"
    plain_file.write_bytes(b"\n".join(plain_records) + b"\n")

    def batch(path: Path, compression: str) -> bytes:
        message = {
            "type": "BATCH",
            "stream": "events",
            "encoding": {"format": "jsonl", "compression": compression},
            "manifest": [path.as_uri()],
        }
        return json.dumps(message).encode()

    lines = [
        schema_msg("events", USERS, ["id"]),
        record_msg("events", {"id": 1}, "2024-04-02T00:00:00.000Z"),
        batch(gz_file, "gzip"),
        batch(plain_file, "none"),
        record_msg("events", {"id": 2}, "2024-04-02T12:00:00.000Z"),
        state_msg({"batches": 2}),
    ]
    states = land(lake.config, joined(lines))

    assert states == ['{"batches": 2}']
    stored = lake.stored("events")
    assert len(stored) == 5
    assert stored[0] == lines[1] and stored[4] == lines[4]

    class Envelope(msgspec.Struct):
        type: str
        stream: str
        record: msgspec.Raw

    landed = [msgspec.json.decode(line, type=Envelope) for line in stored[1:4]]
    assert all((m.type, m.stream) == ("RECORD", "events") for m in landed)
    assert [bytes(m.record) for m in landed] == batch_records + plain_records  # byte for byte
    (entry,) = lake.manifest("events")["files"]
    assert entry["records"] == 5
    assert (entry["start"], entry["end"]) == (ms("2024-04-01T00:00:00.000Z"), ms("2024-04-03T00:00:00.000Z"))


def test_activate_version_is_recorded_in_the_manifest(lake):
    lines = [
        schema_msg("s", USERS, ["id"]),
        record_msg("s", {"id": 1}, "2024-01-01T00:00:00.000Z"),
        record_msg("s", {"id": 2}, "2024-01-01T00:00:01.000Z"),
        b'{"type":"ACTIVATE_VERSION","stream":"s","version":1700000000123}',
        record_msg("s", {"id": 3, "name": "after"}, "2024-01-01T00:00:02.000Z"),
    ]
    land(lake.config, joined(lines))

    manifest = lake.manifest("s")
    (activation,) = manifest["activate_versions"]
    assert activation["version"] == 1700000000123
    files = manifest["files"]
    assert [entry["records"] for entry in files] == [2, 1]
    # Recorded after the commit holding the records sent before it, before the records after it.
    assert activation["after_commit"] == files[0]["commit"] < files[1]["commit"]
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", activation["received"])
    assert lake.stored("s") == [lines[1], lines[2], lines[4]]


# -- bad input -----------------------------------------------------------------------------------
def _input_with_bad_line() -> tuple[list[bytes], int]:
    lines = [
        schema_msg("s", USERS, ["id"]),  # 1
        record_msg("s", {"id": 1}, "2024-01-01T00:00:01.000Z"),  # 2
        record_msg("s", {"id": 2}, "2024-01-01T00:00:02.000Z"),  # 3  -> batch of 2 commits
        state_msg({"n": 2}),  # 4
        record_msg("s", {"id": 3}, "2024-01-01T00:00:03.000Z"),  # 5
        record_msg("s", {"id": 4}, "2024-01-01T00:00:04.000Z"),  # 6  -> batch of 2 commits
        state_msg({"n": 4}),  # 7
        record_msg("s", {"id": 5}, "2024-01-01T00:00:05.000Z"),  # 8  (in the failing batch)
        b'{"type":"RECORD","stream":"s","record":{"id":6,',  # 9  malformed
        record_msg("s", {"id": 7}, "2024-01-01T00:00:07.000Z"),  # 10
        state_msg({"n": 7}),  # 11
    ]
    return lines, 9


def _assert_only_first_batches_committed(lake: LakeUnderTest, lines: list[bytes]) -> None:
    assert lake.stored("s") == lines[1:3] + lines[4:6]
    assert set(lake.data_keys()) == {entry["path"] for entry in lake.manifest("s")["files"]}  # no orphans
    assert lake.locks() == []


def test_malformed_json_names_the_line_and_keeps_earlier_commits(lake):
    lines, bad = _input_with_bad_line()
    error, states = land_failing(lake.config, joined(lines), batch_max_rows=2)
    assert f"line {bad}" in str(error) and "JSON" in str(error)
    assert states == ['{"n": 2}', '{"n": 4}']
    _assert_only_first_batches_committed(lake, lines)


def test_cli_malformed_json_exits_non_zero_naming_the_line(local_lake, tmp_path):
    lines, bad = _input_with_bad_line()
    run = run_cli({**local_lake.config, "batch_max_rows": 2}, joined(lines), tmp_path)
    assert run.returncode != 0
    assert f"line {bad}".encode() in run.stderr, run.stderr[-3000:]
    assert run.stdout.decode().splitlines() == ['{"n": 2}', '{"n": 4}']
    _assert_only_first_batches_committed(local_lake, lines)


def test_record_before_schema_is_a_clear_error(lake):
    lines = [
        schema_msg("known", USERS, ["id"]),
        record_msg("known", {"id": 1}),
        record_msg("unknown", {"id": 1}),
        state_msg({"n": 1}),
    ]
    error, states = land_failing(lake.config, joined(lines))
    assert isinstance(error, RecordsWithoutSchemaException)
    assert "line 3" in str(error) and "'unknown'" in str(error) and "SCHEMA" in str(error)
    assert states == []
    assert lake.data_keys() == [] and lake.locks() == []


def test_record_missing_a_key_property_is_a_clear_error(local_lake):
    lake = local_lake
    lines = [schema_msg("keyed", USERS, ["id"]), record_msg("keyed", {"id": 1}), record_msg("keyed", {"name": "no id"})]
    error, states = land_failing(lake.config, joined(lines))
    assert isinstance(error, MissingKeyPropertiesError)
    assert "line 3" in str(error) and "'keyed'" in str(error) and "id" in str(error)
    assert states == [] and lake.data_keys() == [] and lake.locks() == []


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        (b'{"type":"RECORD","stream":"s"}', "JSON object in 'record'"),
        (b'{"type":"RECORD","stream":"s","record":[1,2]}', "JSON object in 'record'"),
        (b'{"type":"RECORD","stream":"s","record":"text"}', "JSON object in 'record'"),
        (b'{"type":"RECORD","stream":"s","record":{"id":1,"name":"caf\xe9 latin-1"}}', "UTF-8"),
        (b'{"type":"RECORD","stream":"s","record":{"id":1},"time_extracted":17}', "line 3"),
        (b'{"stream":"s","record":{"id":1}}', "not a Singer message"),
        (b'{"type":"BOGUS","stream":"s"}', "unknown message type"),
    ],
    ids=["no-record", "array-record", "string-record", "latin-1-bytes", "numeric-time", "no-type", "unknown-type"],
)
def test_invalid_singer_messages_are_rejected_naming_the_line(local_lake, bad_line, expected):
    lake = local_lake
    lines = [schema_msg("s", {"type": "object", "properties": {}}), record_msg("s", {"id": 0}), bad_line]
    error, states = land_failing(lake.config, joined(lines))
    assert "line 3" in str(error) and expected in str(error)
    assert states == [] and lake.data_keys() == [] and lake.locks() == []


def test_blank_lines_are_skipped_but_counted(local_lake):
    lake = local_lake
    blank = [b"", b"   ", b"\t \t \t \t \t \t", b" " * 40]
    lines = [schema_msg("s", USERS), *blank, record_msg("s", {"id": 1}), *blank, record_msg("s", {"id": 2}), state_msg({"n": 2})]
    assert land(lake.config, joined(lines)) == ['{"n": 2}']
    assert lake.stored("s") == [lines[5], lines[10]]
    error, _ = land_failing(lake.config, joined([*lines, *blank, b"{not json"]))
    assert f"line {len(lines) + len(blank) + 1}:" in str(error)


def test_validate_records_rejects_a_bad_record_naming_line_and_stream(local_lake):
    lake = local_lake
    lines = [
        schema_msg("strict", USERS, ["id"]),
        record_msg("strict", {"id": 1, "name": "ok"}),
        record_msg("strict", {"id": "not a number", "name": "bad"}),
    ]
    error, states = land_failing(lake.config, joined(lines), validate_records=True)
    assert "line 3" in str(error) and "'strict'" in str(error) and "id" in str(error)
    assert states == [] and lake.data_keys() == [] and lake.locks() == []


def test_records_are_not_validated_by_default(local_lake):
    lake = local_lake
    lines = [schema_msg("lenient", USERS, ["id"]), record_msg("lenient", {"id": "not a number", "extra": [1]})]
    land(lake.config, joined(lines))
    assert lake.stored("lenient") == [lines[1]]


# -- settings ------------------------------------------------------------------------------------
def _config_error(config: dict) -> str:
    """Construct the target (no input at all) and return the error's text, SDK validation details included."""
    with pytest.raises((ValueError, ConfigValidationError)) as info:
        TargetSingerlake(config=config)
    return " ".join([str(info.value), *getattr(info.value, "errors", [])])


def test_missing_bucket_is_a_config_error_naming_lake_root(s3_root):
    config = {**s3_lake_at(s3_root).config, "lake_root": "s3://no-such-bucket-here/lake"}
    message = _config_error(config)
    assert "lake_root" in message and "no-such-bucket-here" in message


@contextlib.contextmanager
def _bucket_dropped(lake):
    """The lake's bucket deleted, contents and all, and made again (empty) afterwards for its fixture to drop."""
    client, bucket = lake.storage.client, lake.storage.bucket
    for key in lake.everything():
        client.delete_object(Bucket=bucket, Key=key)
    client.delete_bucket(Bucket=bucket)
    try:
        yield
    finally:
        client.create_bucket(Bucket=bucket)


def test_a_root_gone_since_this_machine_proved_it_fails_at_the_first_request_naming_lake_root(s3_root, tmp_path):
    """A root a run proved writable is not probed again (SPEC.md §10): when its bucket is gone since,
    the run's first request fails, and says so as the probe would: one line naming lake_root, exit 2,
    no STATE. The root is forgotten: the next run probes it before reading any input."""
    lake = s3_lake_at(s3_root)
    lines = [schema_msg("users", USERS, ["id"]), record_msg("users", {"id": 1}), state_msg({"n": 1})]
    assert land(lake.config, joined(lines)) == ['{"n": 1}']
    assert proven.is_proven(lake.storage)
    with _bucket_dropped(lake):
        run = run_cli(lake.config, joined(lines), tmp_path)
        stderr = run.stderr.decode()
        assert run.returncode == 2 and run.stdout == b"", stderr[-3000:]
        assert "target-singerlake: error: setting 'lake_root': " in stderr and lake.storage.bucket in stderr, stderr[-3000:]
        assert "Traceback" not in stderr
        assert not proven.is_proven(lake.storage)
        assert lake.storage.bucket in _config_error(lake.config), "probed again, before any input"


def test_a_run_of_no_records_on_a_root_gone_since_probes_it_before_its_state(s3_root, tmp_path):
    lake = s3_lake_at(s3_root)
    assert land(lake.config, joined([schema_msg("users", USERS), record_msg("users", {"id": 1})])) == []
    with _bucket_dropped(lake):
        run = run_cli(lake.config, joined([state_msg({"n": 2})]), tmp_path)
    stderr = run.stderr.decode()
    assert run.returncode == 2 and run.stdout == b"", stderr[-3000:]
    assert "setting 'lake_root': " in stderr and "Traceback" not in stderr, stderr[-3000:]


def test_unwritable_local_root_is_a_config_error_naming_lake_root(tmp_path):
    blocker = tmp_path / "a-regular-file"
    blocker.write_text("not a directory")
    message = _config_error({"lake_root": str(blocker / "lake"), "tap_id": TAP})
    assert "lake_root" in message and str(blocker) in message
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize(
    "spark_conf",
    ["spark.executor.memory=1g", ["spark.executor.memory"], {"executor.memory": "1g"}, {"spark.executor.memory": {"v": "1g"}}],
    ids=["string", "list", "key-without-spark-prefix", "object-value"],
)
def test_bad_spark_conf_is_a_config_error_naming_it(tmp_path, spark_conf):
    message = _config_error({"lake_root": str(tmp_path / "lake"), "tap_id": TAP, "spark_conf": spark_conf})
    assert "spark_conf" in message
    assert not (tmp_path / "lake" / "raw").exists()


def test_missing_tap_id_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.delenv("MELTANO_EXTRACTOR_NAME", raising=False)
    message = _config_error({"lake_root": str(tmp_path / "lake")})
    assert "tap_id" in message and "MELTANO_EXTRACTOR_NAME" in message


def test_tap_id_defaults_to_meltano_extractor_name(local_lake, monkeypatch):
    lake = local_lake
    monkeypatch.setenv("MELTANO_EXTRACTOR_NAME", "tap-from-meltano")
    config = {key: value for key, value in lake.config.items() if key != "tap_id"}
    lines = [schema_msg("s", USERS), record_msg("s", {"id": 1})]
    land(config, joined(lines))
    assert lake.stored("s", tap="tap-from-meltano") == [lines[1]]
    # An explicit tap_id wins over the environment.
    land(lake.config, joined(lines))
    assert lake.stored("s", tap=TAP) == [lines[1]]
    assert Lake.open(lake.config["lake_root"]).taps() == sorted([TAP, "tap-from-meltano"])


# -- hostile names -------------------------------------------------------------------------------
def test_hostile_stream_and_tap_names_stay_under_the_root(lake):
    tap = "../up"
    streams = ["../../etc", "a/b", "..", "/abs", "C:\\win"]
    lines = [schema_msg(stream, USERS) for stream in streams]
    lines += [record_msg(stream, {"id": index}, "2024-01-01T00:00:00.000Z") for index, stream in enumerate(streams)]

    land({**lake.config, "tap_id": tap}, joined(lines))

    everything = lake.everything()
    assert everything
    inside = (f"{lake.root_prefix()}raw/", f"{lake.root_prefix()}changes/")  # the data, and the tap's change log
    assert all(key.startswith(inside) and ".." not in key.split("/") for key in everything), everything
    assert lake.storage.list_dirs("raw/") == ["~2e~2e~2fup"]
    assert lake.storage.list_dirs("changes/") == ["~2e~2e~2fup"]
    assert set(lake.storage.list_dirs("raw/~2e~2e~2fup/")) == {"~2e~2e~2f~2e~2e~2fetc", "a~2fb", "~2e~2e", "~2fabs", "~43~3a~5cwin"}
    reader = Lake.open(lake.config["lake_root"], **({} if lake.kind == "local" else _reader_options(lake.config)))
    assert reader.taps() == [tap]
    assert reader.streams(tap) == sorted(streams)
    for index, stream in enumerate(streams):
        assert lake.stored(stream, tap=tap) == [lines[len(streams) + index]]
    assert lake.locks() == []


def _reader_options(config: dict) -> dict:
    return {name: config[f"s3_{name}"] for name in ("endpoint_url", "access_key_id", "secret_access_key", "region")}


# -- the real CLI --------------------------------------------------------------------------------
def test_cli_lands_on_s3_with_tap_id_from_meltano(s3_root, tmp_path):
    lake = s3_lake_at(s3_root)
    config = {key: value for key, value in lake.config.items() if key != "tap_id"}
    lines = [schema_msg("public.users", USERS, ["id"]), schema_msg("Orders", ORDERS)]
    for n in range(1, 6):
        lines.append(record_msg("public.users", {"id": n, "name": "名前"}, f"2024-01-0{n}T00:00:00.000Z"))
        lines.append(record_msg("Orders", '{"order":"o","total":123456789012345678901234567890.5}', f"2024-02-0{n}T00:00:00.000Z"))
        lines.append(state_msg({"n": n}))

    run = run_cli({**config, "batch_max_rows": 4}, joined(lines), tmp_path, env={"MELTANO_EXTRACTOR_NAME": "tap-meltano"})

    assert run.returncode == 0, run.stderr.decode()[-3000:]
    states = [json.loads(line) for line in run.stdout.decode().splitlines()]
    assert states and states[-1] == {"n": 5}
    assert [s["n"] for s in states] == sorted({s["n"] for s in states})
    for stream in ("public.users", "Orders"):
        assert lake.stored(stream, tap="tap-meltano") == [line for line in lines if f'"stream":"{stream}","record"'.encode() in line]
    assert lake.locks() == []
    assert list(lake.json("raw/singerlake.json")["taps"]) == ["tap-meltano"]
    under = tuple(lake.storage.prefix + place for place in ("raw/tap-meltano/", "changes/tap-meltano/", "raw/singerlake.json"))
    assert all(key.startswith(under) for key in lake.everything()), lake.everything()


def test_cli_about_lists_settings_and_marks_secrets():
    run = subprocess.run([CLI, "--about", "--format", "json"], capture_output=True, text=True, timeout=120, check=True)
    about = json.loads(run.stdout)
    assert about["name"] == "target-singerlake"
    settings = about["settings"]["properties"]
    for name in (
        "lake_root",
        "tap_id",
        "s3_region",
        "s3_profile",
        "s3_endpoint_url",
        "s3_access_key_id",
        "s3_secret_access_key",
        "s3_session_token",
        "owner",
        "description",
        "docs_url",
        "logs_url",
        "spark_master",
        "spark_remote",
        "spark_conf",
        "batch_max_rows",
        "batch_max_bytes",
        "max_file_bytes",
        "validate_records",
        "lock_wait_seconds",
        "compression_level",
    ):
        assert name in settings, name
        assert settings[name].get("description"), name
    secrets = {name for name, spec in settings.items() if spec.get("secret")}
    assert secrets == {"s3_access_key_id", "s3_secret_access_key", "s3_session_token"}
    assert "default" not in settings["lake_root"] and "$SINGERLAKE_LAKE_ROOT, else ./singerlake" in settings["lake_root"]["description"]
    assert "object" in json.dumps(settings["spark_conf"]["type"])
    # SDK record settings that a raw zone ignores are not offered.
    assert not {"add_record_metadata", "load_method", "flattening_enabled"} & set(settings)


# -- a paused tap ----------------------------------------------------------------------------------
def test_a_paused_tap_still_gets_its_batch_committed_and_its_state_emitted(local_lake, tmp_path):
    """Records then STATE arrive, then the input goes quiet (stdin stays open): once the batch is
    older than max_batch_age_seconds it is committed and the STATE printed, without more input."""
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({**local_lake.config, "max_batch_age_seconds": 1}))
    lines = [schema_msg("users", USERS, ["id"])]
    lines += [record_msg("users", {"id": n, "name": f"u{n}"}, "2024-01-01T00:00:00Z") for n in range(3)]
    lines.append(state_msg({"bookmarks": {"users": 3}}))
    proc = subprocess.Popen([CLI, "--config", str(config_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(joined(lines))
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 120)  # a hang detector, not a speed limit
        assert ready, "no STATE while the input was paused: the old batch was never committed"
        emitted = proc.stdout.readline()
        assert json.loads(emitted) == {"bookmarks": {"users": 3}}
        assert local_lake.stored("users") == lines[1:4]  # committed before the STATE went out
        proc.stdin.close()
        assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
