"""tap-singerlake over lakes written by target-singerlake: real Spark, real HTTP S3 (moto, SeaweedFS), the real CLI.

Each test lands input with the target (in-process, shared SparkSession), then replays the lake
with the tap, in-process or as the ``tap-singerlake`` command, and compares with the input.
"""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest
from singerlake.format.datafile import write_data_file
from singerlake.format.layout import StreamPaths
from singerlake.format.metadata import blake2_hex
from singerlake.times import parse_time_ms
from support.lakes import TAP, LakeUnderTest, joined, land, record_msg, schema_msg
from support.taps import (
    ORDERS,
    TAP_CLI,
    USERS_V1,
    USERS_V2,
    last_state,
    of_type,
    replay,
    run_tap,
    sample_input,
    schema_in_force,
    sent_records,
    tap_config,
)
from tap_singerlake.tap import ConfigError, TapSingerlake


# -- faithful replay -------------------------------------------------------------------------------
def test_replay_returns_exactly_what_was_sent_in_order_with_each_schema_before_its_records(lake):
    data = sample_input()
    land(lake.config, data, batch_max_rows=17)
    out = replay(tap_config(lake))

    for stream in ("users", "public.orders"):
        assert of_type(out, "RECORD", stream) == sent_records(data, stream)  # byte for byte, in order
    sent = [line for line in data.splitlines() if line.strip()]
    assert schema_in_force(out) == sorted(schema_in_force(sent), key=lambda pair: pair[0] != "public.orders")
    assert [json.loads(line)["schema"] for line in of_type(out, "SCHEMA", "users")] == [USERS_V1, USERS_V2]


def test_state_follows_each_file_and_ends_at_each_streams_last_commit(local_lake):
    land(local_lake.config, sample_input(), batch_max_rows=17)
    out = replay(tap_config(local_lake))
    files = {stream: local_lake.manifest(stream)["files"] for stream in ("users", "public.orders")}
    assert len(of_type(out, "STATE")) == sum(len(entries) for entries in files.values())
    final = last_state(out)["bookmarks"]
    for stream, entries in files.items():
        last = entries[-1]
        in_last_commit = sum(e["records"] for e in entries if e["commit"] == last["commit"])
        generation = local_lake.manifest(stream)["generation"]
        assert final[stream]["position"] == {"commit": last["commit"], "records": in_last_commit, "generation": generation}
    # A STATE covers only records before it: replaying from any STATE emits exactly the rest.
    for index, line in enumerate(out):
        if json.loads(line)["type"] == "STATE":
            rest = replay(tap_config(local_lake), state=json.loads(line)["value"])
            assert of_type(rest, "RECORD") == [r for r in of_type(out[index:], "RECORD")]


def test_cli_replays_big_numbers_and_unicode_unchanged(local_lake, tmp_path):
    data = sample_input()
    land(local_lake.config, data)
    result = run_tap(tap_config(local_lake), tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    out = result.stdout.splitlines()
    assert of_type(out, "RECORD", "users") == sent_records(data, "users")
    assert b'"id": 123456789012345678901234567890' in result.stdout
    assert b'"total":1.10000000000000000001' in result.stdout


def test_activate_version_is_replayed_at_its_place(local_lake):
    lines = [schema_msg("users", USERS_V1, ["id"]), record_msg("users", {"id": 1})]
    lines += [b'{"type":"ACTIVATE_VERSION","stream":"users","version":7}', record_msg("users", {"id": 2})]
    land(local_lake.config, joined(lines))
    kinds = [(m["type"], m.get("version")) for m in map(json.loads, replay(tap_config(local_lake))) if m["type"] != "STATE"]
    assert kinds == [("SCHEMA", None), ("RECORD", None), ("ACTIVATE_VERSION", 7), ("RECORD", None)]


# -- incremental -----------------------------------------------------------------------------------
def test_a_rerun_with_the_last_state_emits_only_records_committed_since(lake, tmp_path):
    first = sample_input()
    land(lake.config, first)
    out1 = replay(tap_config(lake))
    assert len(of_type(out1, "RECORD")) == len(sent_records(first, "users")) + len(sent_records(first, "public.orders"))

    more = joined([schema_msg("users", USERS_V2, ["id"]), *(record_msg("users", {"id": 900 + i, "email": "x"}) for i in range(5))])
    land(lake.config, more)
    result = run_tap(tap_config(lake), tmp_path, state=last_state(out1))
    assert result.returncode == 0, result.stderr.decode()
    out2 = result.stdout.splitlines()
    assert of_type(out2, "RECORD") == sent_records(more, "users")
    assert [json.loads(line)["schema"] for line in of_type(out2, "SCHEMA")] == [USERS_V2]

    out3 = replay(tap_config(lake), state=last_state(out2))
    assert of_type(out3, "RECORD") == []


def test_a_bookmark_inside_a_commit_of_several_files_resumes_at_the_next_record(local_lake):
    records = [record_msg("users", {"id": i, "name": "x" * 500}) for i in range(40_000)]
    land(local_lake.config, joined([schema_msg("users", USERS_V1, ["id"]), *records]), max_file_bytes=1)
    files = local_lake.manifest("users")["files"]
    assert len(files) > 2 and len({f["commit"] for f in files}) == 1, "one commit of several files"
    state = {"bookmarks": {"users": {"position": {"commit": 1, "records": 12345}}}}
    assert of_type(replay(tap_config(local_lake), state=state), "RECORD") == records[12345:]


def _compact(lake: LakeUnderTest, stream: str) -> None:
    """What compaction (issue #5) does, by hand: all files of the stream's one version become one
    file carrying the record positions of its records (``runs``), swapped in by one new commit."""
    manifest = lake.manifest(stream)
    old = manifest["files"]
    assert len({e["schema_hash"] for e in old}) == 1
    lines, runs, seen = [], [], {}
    for entry in old:
        body = gzip.decompress(lake.read(entry["path"])).splitlines(keepends=True)
        schema_line, lines = body[0], lines + body[1:]
        runs.append({"commit": entry["commit"], "first": seen.get(entry["commit"], 0), "records": entry["records"]})
        seen[entry["commit"]] = seen.get(entry["commit"], 0) + entry["records"]
    record = write_data_file(
        lake.storage, StreamPaths(TAP, stream), old[0]["schema_hash"], schema_line, lines, [old[0]["start"]] * len(lines)
    )
    manifest["commits"] += 1
    manifest["files"] = [{**record, "commit": manifest["commits"], "runs": runs}]
    lake.storage.write(StreamPaths(TAP, stream).manifest, json.dumps(manifest).encode())


def test_bookmarks_survive_compaction_no_record_is_replayed_twice(lake):
    records = [record_msg("users", {"id": i, "name": "n"}) for i in range(60)]
    land(lake.config, joined([schema_msg("users", USERS_V1, ["id"]), *records]), batch_max_rows=10)
    out = replay(tap_config(lake))
    states = [json.loads(line)["value"] for line in of_type(out, "STATE")]
    assert len(states) == 6

    _compact(lake, "users")
    assert len(lake.manifest("users")["files"]) == 1
    assert of_type(replay(tap_config(lake)), "RECORD") == records  # same records, same order
    assert of_type(replay(tap_config(lake), state=states[-1]), "RECORD") == []  # nothing again
    assert of_type(replay(tap_config(lake), state=states[2]), "RECORD") == records[30:]  # exactly the rest


# -- time window -------------------------------------------------------------------------------------
def _hourly_input(hours: int) -> tuple[bytes, list[bytes]]:
    records = [record_msg("users", {"id": h}, f"2024-03-{1 + h // 24:02d}T{h % 24:02d}:00:00.000Z") for h in range(hours)]
    return joined([schema_msg("users", USERS_V1, ["id"]), *records]), records


def test_time_window_replays_only_records_inside_it_without_opening_files_outside(lake, tmp_path):
    data, records = _hourly_input(60)
    land(lake.config, data, batch_max_rows=10)
    files = lake.manifest("users")["files"]
    assert len(files) == 6
    start, end = "2024-03-02T01:00:00Z", "2024-03-02T18:00:00Z"  # hours 25 .. 41

    # Files wholly outside the window are deleted: a reader that opened one would fail (on_corrupt_file=fail).
    outside = [e for e in files if e["end"] < parse_time_ms(start) or e["start"] >= parse_time_ms(end)]
    assert len(outside) == 3
    for entry in outside:
        lake.storage.delete(entry["path"])

    result = run_tap(tap_config(lake, start_date=start, end_date=end), tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert of_type(result.stdout.splitlines(), "RECORD") == records[25:42]


def test_a_bad_window_setting_is_named():
    with pytest.raises(ConfigError, match="start_date"):
        TapSingerlake(config={"lake_root": "/nonexistent", "start_date": "yesterday-ish"}, validate_config=False)


# -- corrupt data ------------------------------------------------------------------------------------
def _three_files(lake: LakeUnderTest) -> tuple[list[dict], list[bytes]]:
    records = [record_msg("users", {"id": i}) for i in range(30)]
    land(lake.config, joined([schema_msg("users", USERS_V1, ["id"]), *records]), batch_max_rows=10)
    files = lake.manifest("users")["files"]
    assert len(files) == 3
    return files, records


def test_a_truncated_file_stops_the_run_naming_it_after_the_files_before_it(lake, tmp_path):
    files, records = _three_files(lake)
    damaged = files[1]
    lake.storage.write(damaged["path"], lake.read(damaged["path"])[: damaged["size"] // 2])

    result = run_tap(tap_config(lake), tmp_path)
    assert result.returncode != 0
    assert damaged["path"] in result.stderr.decode() and "truncated" in result.stderr.decode()
    out = result.stdout.splitlines()
    assert of_type(out, "RECORD") == records[:10]  # nothing of the damaged file
    generation = lake.manifest("users")["generation"]
    assert last_state(out)["bookmarks"]["users"]["position"] == {"commit": 1, "records": 10, "generation": generation}


def test_a_hash_mismatch_stops_the_run_naming_the_file(local_lake, tmp_path):
    files, _ = _three_files(local_lake)
    damaged = files[2]
    data = bytearray(local_lake.read(damaged["path"]))
    data[len(data) // 2] ^= 0xFF  # same size, different bytes
    local_lake.storage.write(damaged["path"], bytes(data))
    result = run_tap(tap_config(local_lake), tmp_path)
    assert result.returncode != 0
    assert damaged["path"] in result.stderr.decode() and "blake2" in result.stderr.decode()


def test_corrupt_gzip_with_a_matching_hash_is_named(local_lake, tmp_path):
    files, _ = _three_files(local_lake)
    damaged = files[0]
    bad = gzip.compress(b'{"type":"SCHEMA","stream":"users","schema":{}}\n')[:-12] + b"garbage-tail"
    local_lake.storage.write(damaged["path"], bad)
    manifest = local_lake.manifest("users")
    manifest["files"][0].update(hash=blake2_hex(bad), size=len(bad))
    local_lake.storage.write(StreamPaths(TAP, "users").manifest, json.dumps(manifest).encode())
    result = run_tap(tap_config(local_lake), tmp_path)
    assert result.returncode != 0
    assert damaged["path"] in result.stderr.decode() and "gzip" in result.stderr.decode()


def test_corrupt_and_missing_files_can_be_skipped_with_a_warning(local_lake, tmp_path):
    files, records = _three_files(local_lake)
    local_lake.storage.delete(files[1]["path"])
    result = run_tap(tap_config(local_lake, on_corrupt_file="skip"), tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert of_type(result.stdout.splitlines(), "RECORD") == records[:10] + records[20:]
    assert "skipping a corrupt file" in result.stderr.decode() and files[1]["path"] in result.stderr.decode()


# -- discovery, settings and errors ------------------------------------------------------------------
def _discover(config: dict, tmp_path: Path) -> dict:
    result = run_tap(config, tmp_path, "--discover")
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def test_discovery_lists_each_stream_with_its_keys_and_a_schema_every_version_fits(lake, tmp_path):
    land(lake.config, sample_input())
    catalog = _discover(tap_config(lake), tmp_path)
    streams = {entry["tap_stream_id"]: entry for entry in catalog["streams"]}
    assert sorted(streams) == ["public.orders", "users"]
    assert streams["users"]["key_properties"] == ["id"]
    assert sorted(streams["users"]["schema"]["properties"]) == ["email", "id", "name"]  # v2 plus v1's "name"
    assert streams["public.orders"]["schema"]["properties"] == ORDERS["properties"]


def test_discovery_and_replay_work_with_every_metadata_file_deleted(lake, tmp_path):
    data = sample_input()
    land(lake.config, data)
    before = _discover(tap_config(lake), tmp_path)
    for key in lake.keys():
        if key.endswith((".json",)):
            lake.storage.delete(key)
    assert not [k for k in lake.keys() if k.endswith(".json")]
    assert _discover(tap_config(lake), tmp_path) == before
    out = replay(tap_config(lake))
    for stream in ("users", "public.orders"):
        assert of_type(out, "RECORD", stream) == sent_records(data, stream)


def test_unknown_or_missing_tap_id_lists_the_taps_present(local_lake, tmp_path):
    land(local_lake.config, sample_input())
    for config in (tap_config(local_lake, tap_id="tap-nope"), {k: v for k, v in local_lake.config.items() if k != "tap_id"}):
        result = run_tap(config, tmp_path, "--discover")
        assert result.returncode != 0
        assert "tap_id" in result.stderr.decode() and TAP in result.stderr.decode()


def test_a_missing_lake_root_is_a_clear_error(tmp_path):
    result = run_tap({"lake_root": str(tmp_path / "no-lake"), "tap_id": TAP}, tmp_path, "--discover")
    assert result.returncode != 0
    assert "lake_root" in result.stderr.decode() and "does not exist" in result.stderr.decode()


def test_streams_setting_selects_streams_and_names_unknown_ones(local_lake):
    data = sample_input()
    land(local_lake.config, data)
    out = replay(tap_config(local_lake, streams=["public.orders"]))
    assert {json.loads(line)["stream"] for line in of_type(out, "RECORD")} == {"public.orders"}
    with pytest.raises(ConfigError, match=r"streams.*nope.*streams present"):
        replay(tap_config(local_lake, streams=["nope"]))


def test_catalog_selection_and_stream_maps_go_through_the_sdk(local_lake, tmp_path):
    data = sample_input()
    land(local_lake.config, data)
    catalog = _discover(tap_config(local_lake), tmp_path)
    for entry in catalog["streams"]:
        selected = entry["tap_stream_id"] == "users"
        for item in entry["metadata"]:
            if item["breadcrumb"] == []:
                item["metadata"]["selected"] = selected
            elif item["breadcrumb"] == ["properties", "name"]:
                item["metadata"]["selected"] = False
    out = replay(tap_config(local_lake, stream_maps={"users": {"email": "__NULL__", "id_text": "str(id)"}}), catalog=catalog)
    records = [json.loads(line)["record"] for line in of_type(out, "RECORD")]
    assert {json.loads(line)["stream"] for line in of_type(out, "RECORD")} == {"users"}
    assert len(records) == len(sent_records(data, "users"))
    assert all("name" not in r and "email" not in r and r["id_text"] == str(r["id"]) for r in records)
    assert last_state(out)["bookmarks"]["users"]["position"]["commit"] >= 1


def test_about_describes_every_setting_and_marks_secrets(tmp_path):
    result = subprocess.run([TAP_CLI, "--about", "--format", "json"], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    about = json.loads(result.stdout)
    settings = about["settings"]["properties"]
    for name in ("lake_root", "tap_id", "streams", "start_date", "end_date", "on_corrupt_file", "s3_endpoint_url"):
        assert settings[name].get("description"), name
    assert {name for name, spec in settings.items() if spec.get("secret")} == {
        "s3_access_key_id",
        "s3_secret_access_key",
        "s3_session_token",
    }
    assert "batch" not in about["capabilities"] and "batch_config" not in settings
    assert {"catalog", "state", "discover", "stream-maps"} <= set(about["capabilities"])
