"""The `singerlake` lake jobs over real Spark, on the local backend and HTTP S3 (moto, SeaweedFS).

In-process jobs share the test session's SparkSession; the CLI tests run `singerlake` as a command
(its own Spark), including one on `local-cluster[2,1,1024]`.
"""

from __future__ import annotations

import io
import json
import os
import random
import tempfile
import uuid
from collections.abc import Callable
from contextlib import redirect_stdout
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from singerlake import Lake
from singerlake.format.datafile import write_data_file
from singerlake.format.errors import BadBookmark
from singerlake.format.layout import StreamPaths
from singerlake.format.manifest import Manifest
from singerlake.format.schema_hash import schema_hash
from singerlake.jobs.compact import compact, compact_stream
from singerlake.jobs.repair import repair
from singerlake.jobs.vacuum import vacuum
from singerlake.jobs.verify import verify
from singerlake.sources import register
from singerlake.tables.project import project
from singerlake.times import iso_ms, now_ms
from support.lake_cli import open_lake, run_cli
from support.lakes import TAP, LakeUnderTest, joined, land, local_lake_at, record_msg, schema_msg
from support.taps import last_state, of_type, replay, sample_input
from tap_singerlake.tap import TapSingerlake

DAY_MS = 24 * 3600 * 1000


def local_lake_in(directory: Path) -> LakeUnderTest:
    directory.mkdir()
    return local_lake_at(directory)


def stored_lines(lake: LakeUnderTest) -> dict[str, list[bytes]]:
    return {stream: of_type(replay(lake.config), "RECORD", stream) for stream in ("users", "public.orders")}


# -- verify ----------------------------------------------------------------------------------------
def test_verify_is_clean_on_a_landed_lake_and_names_each_planted_fault(lake, tmp_path, cli_session):
    land(lake.config, sample_input(), batch_max_rows=10)
    cli = cli_session(lake)  # both verify runs on the module's Spark session
    clean = cli.run("verify")
    assert clean.returncode == 0, clean.stderr
    assert "clean" in clean.stdout

    files = lake.manifest("users")["files"]
    missing, truncated, flipped = files[0], files[1], files[2]
    lake.storage.delete(missing["path"])
    lake.storage.write(truncated["path"], lake.read(truncated["path"])[:-5])
    data = bytearray(lake.read(flipped["path"]))
    data[20] ^= 0xFF
    lake.storage.write(flipped["path"], bytes(data))
    orphan = flipped["path"].replace(flipped["id"], "0" * 32)
    lake.storage.write(orphan, lake.read(files[3]["path"]))
    manifest = lake.manifest("public.orders")
    manifest["versions"]["0000000000000"] = {"version": "v9", "schema": {}, "key_properties": [], "first_seen": iso_ms(0)}
    lake.storage.write(StreamPaths(TAP, "public.orders").manifest, json.dumps(manifest).encode())
    lock = StreamPaths(TAP, "users").lock(files[3]["schema_hash"])
    lake.storage.write(
        lock, json.dumps({"writer-id": "w-dead", "acquired": iso_ms(0), "refreshed": iso_ms(0), "lease_seconds": 60}).encode()
    )

    result = cli.run("verify", "--json")
    assert result.returncode == 1, result.stderr
    found = {(f["kind"], f["path"]) for f in json.loads(result.stdout)["findings"]}
    assert found == {
        ("missing", missing["path"]),
        ("size_mismatch", truncated["path"]),
        ("hash_mismatch", flipped["path"]),
        ("orphan", orphan),
        ("version_without_files", StreamPaths(TAP, "public.orders").schema_dir("0000000000000")),
        ("stale_lock", lock),
    }


# -- repair ----------------------------------------------------------------------------------------
def test_repair_rebuilds_deleted_metadata_equivalently_and_the_tap_replays_the_same(lake, spark):
    land(lake.config, sample_input(), batch_max_rows=10)
    before = {stream: lake.manifest(stream) for stream in ("users", "public.orders")}
    replayed_before = stored_lines(lake)
    bookmark = last_state(replay(lake.config))
    metadata = [key for key in lake.keys() if key.endswith(".json")]
    for key in metadata:
        lake.storage.delete(key)

    planned = repair(open_lake(lake), spark)  # dry run
    assert {a.path for a in planned} == set(metadata)
    assert not [key for key in lake.keys() if key.endswith(".json")], "a dry run changes nothing"

    repair(open_lake(lake), spark, apply=True)
    for stream, old in before.items():
        new = lake.manifest(stream)
        assert {v["version"]: h for h, v in new["versions"].items()} == {v["version"]: h for h, v in old["versions"].items()}
        strip = ("commit", "work_id")
        assert [{k: v for k, v in f.items() if k not in strip} for f in new["files"]] == [
            {k: v for k, v in f.items() if k not in strip} for f in old["files"]
        ]
    assert stored_lines(lake) == replayed_before
    # Commits were renumbered (one per file): a bookmark from before the rebuild is refused, not misread.
    assert lake.manifest("users")["generation"] != before["users"]["generation"]
    with pytest.raises(BadBookmark, match="stream 'public.orders'.*rebuilt"):
        replay(lake.config, state=bookmark)
    assert repair(open_lake(lake), spark, apply=True) == []  # nothing left to repair
    assert verify(open_lake(lake), spark) == []


def test_repair_of_a_lost_root_removes_the_old_roots_parts_and_verify_is_then_clean(local_lake, spark, monkeypatch, cli_session):
    """The rebuilt root names parts of its own: the lost root's parts are part of that stream's repair,
    listed by the dry run and removed by --apply, so the next verify exits 0 (issue #24)."""
    import singerlake.format.manifest as manifest_module

    monkeypatch.setattr(manifest_module, "TAIL_FILE_BYTES", 900)  # a part every few files
    land(local_lake.config, sample_input(), batch_max_rows=4)  # users: 15 files, 8 parts sealed
    paths = StreamPaths(TAP, "users")
    old_parts = [key for key in local_lake.keys() if key.startswith(f"{paths.stream_dir}/_manifest/")]
    assert old_parts, "the landing sealed parts"
    local_lake.storage.delete(paths.manifest)

    planned = {a.path: a.change for a in repair(open_lake(local_lake), spark)}
    assert set(old_parts) <= set(planned) and all(planned[key].startswith("remove") for key in old_parts)
    assert all(local_lake.storage.exists(key) for key in old_parts), "a dry run removes nothing"
    repair(open_lake(local_lake), spark, apply=True)
    assert not any(local_lake.storage.exists(key) for key in old_parts)
    assert verify(open_lake(local_lake), spark) == []
    assert cli_session(local_lake).run("verify").returncode == 0


def test_repair_leaves_orphans_of_a_valid_manifest_for_vacuum(local_lake, spark):
    land(local_lake.config, sample_input())
    files = local_lake.manifest("users")["files"]
    local_lake.storage.write(files[0]["path"].replace(files[0]["id"], "0" * 32), local_lake.read(files[0]["path"]))
    assert repair(open_lake(local_lake), spark, apply=True) == []
    assert local_lake.manifest("users")["files"] == files


# -- vacuum ----------------------------------------------------------------------------------------
def test_vacuum_removes_temp_files_a_killed_local_write_left(local_lake):
    land(local_lake.config, sample_input())
    entry = local_lake.manifest("users")["files"][0]
    schema_dir = Path(local_lake.config["lake_root"], entry["path"]).parent
    (schema_dir / ".tmp-half-written.singer.gz.1234").write_bytes(b"partial")
    (schema_dir / ".tmp-in-flight.singer.gz.5678").write_bytes(b"partial")
    eight_days_ago = (now_ms() - 8 * DAY_MS) / 1000
    os.utime(schema_dir / ".tmp-half-written.singer.gz.1234", (eight_days_ago, eight_days_ago))
    deleted = vacuum(open_lake(local_lake), apply=True)
    assert [Path(d.path).name for d in deleted] == [".tmp-half-written.singer.gz.1234"]
    assert sorted(p.name for p in schema_dir.iterdir() if p.name.startswith(".tmp-")) == [".tmp-in-flight.singer.gz.5678"]


def test_vacuum_respects_retention_and_never_deletes_referenced_files(lake):
    land(lake.config, sample_input())
    entry = lake.manifest("users")["files"][0]
    orphan = entry["path"].replace(entry["id"], "0" * 32)
    lake.storage.write(orphan, lake.read(entry["path"]))
    referenced = set(lake.data_keys()) - {orphan}

    assert vacuum(open_lake(lake), apply=True) == []  # 7 days by default: the orphan is too young
    planned = vacuum(open_lake(lake), retention_s=0, force=True)
    assert [d.path for d in planned] == [orphan] and lake.storage.exists(orphan), "dry run by default"
    later = now_ms() + DAY_MS
    assert [d.path for d in vacuum(open_lake(lake), retention_s=0, apply=True, now=later, force=True)] == [orphan]
    assert set(lake.data_keys()) == referenced


# -- compact ---------------------------------------------------------------------------------------
SMALL = {"type": "object", "properties": {"id": {"type": "integer"}, "pad": {"type": "string"}}}


def small_files_stream(lake: LakeUnderTest, files: int, per_file: int) -> list[bytes]:
    """A stream of many small files, one commit each, written with the core (as many small batches would)."""
    paths = StreamPaths(TAP, "events")
    line = json.dumps({"type": "SCHEMA", "stream": "events", "schema": SMALL, "key_properties": ["id"]}).encode() + b"\n"
    digest = schema_hash(SMALL, ["id"])
    manifest = Manifest(TAP, "events")
    manifest.add_version(digest, SMALL, ["id"], 0)
    lines = []
    for number in range(files):
        chunk = [record_msg("events", {"id": number * per_file + i, "pad": "x"}) + b"\n" for i in range(per_file)]
        manifest.append_commit([write_data_file(lake.storage, paths, digest, line, chunk, [number * 1000] * per_file)])
        lines += [c.rstrip(b"\n") for c in chunk]
    lake.storage.write(paths.manifest, manifest.to_bytes())
    Lake(lake.storage).publish_stream(manifest)
    return lines


class _Seen(Exception):
    """The replay has written the STATE a test waits for."""


class _StatesUntil(io.BytesIO):
    """A replay's stdout that gathers its STATE values and stops the replay at the ``n``th."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.rest, self.states = n, b"", []

    def write(self, data) -> int:
        *lines, self.rest = (self.rest + bytes(data)).split(b"\n")
        for line in lines:
            message = json.loads(line) if b'"STATE"' in line else {}
            if message.get("type") == "STATE":
                self.states.append(message["value"])
                if len(self.states) == self.n:
                    raise _Seen
        return len(data)


def nth_state(config: dict, n: int) -> dict:
    """The value of the ``n``th STATE of a replay (``replay``'s tap, in-process), which stops there: the files after
    that bookmark are not read (on moto, reading the rest of 1050 files took ~7 s)."""
    out = _StatesUntil(n)
    tap = TapSingerlake(config=config)
    with redirect_stdout(io.TextIOWrapper(out, encoding="utf-8", write_through=True)), pytest.raises(_Seen):
        tap.sync_all()
    return out.states[-1]


# More than 1000, so an S3 listing of the stream's files (compaction's, vacuum's) takes more than one page;
# the bookmark after the 700th file lands inside a merged file. (2000 cost ~2.5 min on moto alone, 1200 ~55 s.)
SMALL_FILES = 1050


# SeaweedFS, the real S3 server, pages listings as S3 does; moto added 42 s of CI for the same path.
@pytest.mark.parametrize("lake", ["local", "seaweedfs"], indirect=True)
def test_compacting_over_1000_small_files_keeps_replay_bookmarks_and_a_concurrent_append(lake, spark):
    lines = small_files_stream(lake, files=SMALL_FILES, per_file=50)
    config = {**lake.config, "streams": ["events"]}
    bookmark = nth_state(config, 700)  # after the 700th file
    appended = [record_msg("events", {"id": 10**6 + i, "pad": "new"}) for i in range(30)]

    def target_appends_meanwhile() -> None:
        land(lake.config, joined([schema_msg("events", SMALL, ["id"]), *appended]))

    result = compact_stream(open_lake(lake), spark, TAP, "events", target_bytes=64 << 10, before_commit=target_appends_meanwhile)
    files = lake.manifest("events")["files"]
    assert result.files_before == SMALL_FILES and len(files) <= 30, len(files)
    assert all("runs" in f for f in files[:-1]) and "runs" not in files[-1]  # the append is kept, after the merged files
    assert of_type(replay(config), "RECORD") == lines + appended
    assert of_type(replay(config, state=bookmark), "RECORD") == lines[700 * 50 :] + appended
    assert verify(open_lake(lake), spark) == []
    # Replaced files stay for readers of the old manifest until vacuum, after the retention.
    assert len(lake.manifest("events")["replaced"]) == SMALL_FILES
    assert vacuum(open_lake(lake), retention_s=3600, apply=True) == []
    deleted = vacuum(open_lake(lake), retention_s=3600, apply=True, now=now_ms() + DAY_MS)
    data = [d.path for d in deleted if d.path.endswith(".singer.gz")]
    assert len(data) == SMALL_FILES, "every replaced data file, once the retention has passed"
    assert all("/_manifest/" in d.path for d in deleted if not d.path.endswith(".singer.gz")), "and the superseded parts only"
    assert lake.manifest("events")["replaced"] == []
    assert of_type(replay(config), "RECORD") == lines + appended


def test_compaction_never_merges_across_a_schema_change(local_lake, spark):
    data = sample_input()
    land(local_lake.config, data, batch_max_rows=5)
    before = local_lake.manifest("users")
    compact_stream(open_lake(local_lake), spark, TAP, "users", target_bytes=1 << 20)
    after = local_lake.manifest("users")
    assert len(after["files"]) == len(before["versions"]) == 2
    out = replay(local_lake.config)
    assert of_type(out, "RECORD", "users") == of_type(data.splitlines(), "RECORD", "users")


# -- data source and project -----------------------------------------------------------------------
def test_data_source_reads_a_stream_typed_with_positions(lake, spark):
    land(lake.config, sample_input(), batch_max_rows=10)
    register(spark)
    reader = spark.read.format("singerlake").option("tap_id", TAP).option("stream", "users")
    for name, value in lake.storage.open_options().items():
        reader = reader.option(f"s3_{name}", value)
    frame = reader.load(lake.config["lake_root"])
    types = dict(frame.dtypes)  # the projection's exact types (SPEC.md §12), from the values read
    assert types["id"] == "decimal(30,0)" and types["name"] == "string" and types["email"] == "string"
    rows = frame.orderBy("_singerlake_commit", "_singerlake_index").collect()
    assert len(rows) == 3 + 40 + 15
    assert rows[0]["id"] == Decimal("123456789012345678901234567890")  # beyond 64 bits: exact, not null
    assert rows[1]["id"] == 2 and rows[-1]["email"] == "u14@example.com"
    assert {row["_singerlake_version"] for row in rows} == {"v1", "v2"}
    orders = reader.option("stream", "public.orders").load(lake.config["lake_root"])
    assert dict(orders.dtypes)["total"] == "decimal(21,20)" and orders.first()["total"] == Decimal("1.10000000000000000001")
    v2 = reader.option("stream", "users").option("version", "v2").load(lake.config["lake_root"])
    assert v2.count() == 15 and "name" not in v2.columns and dict(v2.dtypes)["id"] == "bigint"


def published_table(lake: LakeUnderTest, stream: str, version: int | None = None):
    """The stream's Delta table, read by delta-rs (not by this project's code)."""
    from deltalake import DeltaTable
    from singerlake.tables.delta import storage_options, table_key, table_uri

    uri = table_uri(lake.storage, table_key(TAP, stream))
    return DeltaTable(uri, version=version, storage_options=storage_options(lake.storage)).to_pyarrow_table()


def published_rows(lake: LakeUnderTest, stream: str) -> list[dict]:
    return published_table(lake, stream).to_pylist()


def staging_rows(lake: LakeUnderTest, stream: str) -> list[dict]:
    """The current staging parts' rows, as the table's latest commit lists them."""
    from singerlake.tables.delta import latest, table_key

    parts = latest(lake.storage, table_key(TAP, stream)).state["parts"]
    return [row for part in parts for row in pq.read_table(io.BytesIO(lake.read(part["staging"]))).to_pylist()]


def test_project_keeps_one_current_row_per_key_and_processes_only_new_files(lake, spark):
    users = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
    }
    first = [schema_msg("users", users, ["id"]), *(record_msg("users", {"id": i % 10, "name": f"n{i}", "tags": ["a"]}) for i in range(35))]
    land(lake.config, joined(first), batch_max_rows=10)
    result = project(open_lake(lake), spark, TAP)[0]
    assert result["new_records"] == 35 and result["rows"] == 10 and result["version"] == 0

    second = [schema_msg("users", users, ["id"]), *(record_msg("users", {"id": i, "name": f"late{i}", "tags": []}) for i in (3, 42))]
    land(lake.config, joined(second))
    result = project(open_lake(lake), spark, TAP, formats=["delta", "csv"])[0]
    assert result["new_records"] == 2 and result["rows"] == 11 and result["version"] == 1  # only the new commit was read
    assert project(open_lake(lake), spark, TAP)[0] | {"csv": []} == result | {"new_records": 0, "csv": []}  # nothing new: no commit

    rows = published_rows(lake, "users")
    by_id = {row["id"]: row for row in rows}
    assert len(rows) == len(by_id) == 11  # exactly one row per key
    assert by_id[3]["name"] == "late3" and by_id[9]["name"] == "n29" and by_id[42]["tags"] == []
    assert len(published_table(lake, "users", version=0)) == 10  # time travel: the first run's projection
    assert len(staging_rows(lake, "users")) == 11
    csv_rows = sum(lake.read(key).count(b"\n") - 1 for key in result["csv"])
    assert csv_rows == 11


PROFILES = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "seen": {"type": "string", "format": "date-time"},
        "address.city": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}}},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
}


def profile_records(seed: int, count: int) -> list[bytes]:
    """Records of few keys (many updates each), some with a record time and some without, a few null keys."""
    rng = random.Random(seed)
    lines = []
    for n in range(count):
        key = None if rng.random() < 0.05 else rng.randrange(12)
        record = {
            "id": key,
            "name": f"v{seed}-{n}",
            "seen": "2024-05-01T10:00:00Z",
            "address.city": {"city": f"c{n}", "zip": n},
            "tags": ["x", str(n)],
        }
        when = rng.choice([None, "2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z"])  # ties in time are common
        lines.append(record_msg("profiles", record, when))
    return lines


@pytest.mark.parametrize("exchange", ["block files", "shuffle"])
def test_project_gives_the_same_rows_on_the_bucket_path_as_on_the_one_job_path(tmp_path, spark, monkeypatch, exchange):
    """Large streams are kept in buckets of keys by a job each, small ones by one job of pyarrow work items: same rows.
    The bucket path's blocks go through files on this machine, through Spark's shuffle on a cluster (as if here)."""
    import singerlake.tables.buckets

    if exchange == "shuffle":
        monkeypatch.setattr(singerlake.tables.buckets, "runs_elsewhere", lambda session: True)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the block files go
    small_lake, large_lake = local_lake_in(tmp_path / "small"), local_lake_in(tmp_path / "large")
    for landing in range(2):
        data = joined([schema_msg("profiles", PROFILES, ["id"]), *profile_records(landing, 150)])
        for lake in (small_lake, large_lake):
            land(lake.config, data, batch_max_rows=40)  # the same commits and positions in both lakes
        small = project(open_lake(small_lake), spark, TAP)
        large = project(open_lake(large_lake), spark, TAP, small_stream_bytes=0)
        assert [(r["new_records"], r["rows"]) for r in small] == [(r["new_records"], r["rows"]) for r in large] == [(150, 13)]
        by_position = lambda rows: sorted(rows, key=lambda row: (row["_singerlake_commit"], row["_singerlake_index"]))  # noqa: E731
        assert by_position(staging_rows(small_lake, "profiles")) == by_position(staging_rows(large_lake, "profiles"))
        by_name = lambda rows: sorted(rows, key=lambda row: row["name"])  # noqa: E731
        assert by_name(published_rows(small_lake, "profiles")) == by_name(published_rows(large_lake, "profiles"))
        assert published_table(small_lake, "profiles").schema == published_table(large_lake, "profiles").schema
        assert not list(temp.iterdir()), "no block file outlives its run"
    rows = published_rows(small_lake, "profiles")
    assert {row["tags"][0] for row in rows} == {"x"} and all(row["address.city"]["city"] for row in rows)


# -- many streams: one Spark job for all of them, failures reported per stream -----------------------
def many_streams_lake(lake: LakeUnderTest, streams: int, files: int = 3, per_file: int = 4) -> list[str]:
    """Streams s000, s001, ... of ``files`` small files each (one commit each), written with the core."""
    names = [f"s{number:03d}" for number in range(streams)]
    digest = schema_hash(SMALL, ["id"])
    for name in names:
        paths = StreamPaths(TAP, name)
        line = schema_msg(name, SMALL, ["id"]) + b"\n"
        manifest = Manifest(TAP, name)
        manifest.start_generation()
        manifest.add_version(digest, SMALL, ["id"], 0)
        for number in range(files):
            chunk = [record_msg(name, {"id": i, "pad": f"{number}-{i}"}) + b"\n" for i in range(per_file)]
            manifest.append_commit([write_data_file(lake.storage, paths, digest, line, chunk, [number * 1000] * per_file)])
        lake.storage.write(paths.manifest, manifest.to_bytes())
        Lake(lake.storage).publish_stream(manifest)
    return names


def spark_jobs(spark, job: Callable[[], object]) -> int:
    """How many Spark jobs ``job()`` started (it runs in a job group of its own)."""
    group = f"counted-{uuid.uuid4().hex}"
    spark.sparkContext.setJobGroup(group, "counted by a test")
    try:
        job()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def jobs_per_lake_job(spark, lake: LakeUnderTest, streams: int) -> dict[str, int]:
    """Spark jobs of repair, verify, compact and project on a lake of ``streams`` streams, each checked for its effect."""
    names = many_streams_lake(lake, streams)
    for name in names:
        lake.storage.delete(StreamPaths(TAP, name).manifest)
    jobs = {"repair": spark_jobs(spark, lambda: repair(open_lake(lake), spark, apply=True))}
    assert all(len(lake.manifest(name)["files"]) == 3 for name in names), "repair rebuilt every manifest"
    jobs["verify"] = spark_jobs(spark, lambda: verify(open_lake(lake), spark))
    jobs["compact"] = spark_jobs(spark, lambda: compact(open_lake(lake), spark))
    assert all(len(lake.manifest(name)["files"]) == 1 for name in names), "compact merged every stream"
    assert verify(open_lake(lake), spark) == []
    jobs["project"] = spark_jobs(spark, lambda: project(open_lake(lake), spark))
    assert all(len(staging_rows(lake, name)) == 4 for name in names), "project wrote every stream's current rows"
    return jobs


def test_verify_repair_compact_and_project_run_as_many_spark_jobs_for_30_streams_as_for_3(tmp_path, spark):
    few = jobs_per_lake_job(spark, local_lake_in(tmp_path / "few"), 3)
    many = jobs_per_lake_job(spark, local_lake_in(tmp_path / "many"), 30)
    assert many == few, (few, many)
    assert all(1 <= count <= 2 for count in many.values()), many


def test_a_failing_stream_is_reported_by_name_and_the_others_are_compacted_and_projected(local_lake, cli_session):
    good, corrupt, invalid = many_streams_lake(local_lake, 3)
    cli = cli_session(local_lake)  # compact and project on the module's Spark session
    damaged = local_lake.manifest(corrupt)["files"][1]
    data = bytearray(local_lake.read(damaged["path"]))
    data[-12] ^= 0xFF  # same size, another hash
    local_lake.storage.write(damaged["path"], bytes(data))

    compacted = cli.run("compact", "--json")
    assert compacted.returncode == 1, compacted.stderr[-3000:]
    failures = json.loads(compacted.stdout)["failures"]
    assert [(f["tap_id"], f["stream"]) for f in failures] == [(TAP, corrupt)]
    assert "blake2 hash" in failures[0]["cause"] and damaged["path"] in failures[0]["cause"]
    reported = [line for line in compacted.stderr.splitlines() if line.startswith("singerlake compact: failed:")]
    assert len(reported) == 1 and repr(corrupt) in reported[0] and TAP in reported[0] and "Traceback" not in compacted.stderr
    assert [len(local_lake.manifest(name)["files"]) for name in (good, corrupt, invalid)] == [1, 3, 1]

    local_lake.storage.write(StreamPaths(TAP, invalid).manifest, b'{"format": "singerlake-manifest"}')
    projected = cli.run("project")
    assert projected.returncode == 1, projected.stderr[-3000:]
    reported = [line for line in projected.stderr.splitlines() if line.startswith("singerlake project: failed:")]
    assert len(reported) == 2, projected.stderr[-3000:]
    assert repr(corrupt) in reported[0] and "blake2 hash" in reported[0]
    assert repr(invalid) in reported[1] and "manifest.json" in reported[1] and "'tap_id'" in reported[1]
    assert f"{good}: 12 new records, 4 current rows" in projected.stdout
    assert len(staging_rows(local_lake, good)) == 4
    assert not local_lake.keys(f"published/{TAP}/{corrupt}/") and not local_lake.keys(f"published/{TAP}/{invalid}/")


# -- locks, describe, the CLI on a cluster ---------------------------------------------------------
def test_locks_are_listed_and_broken_only_with_force(local_lake):
    land(local_lake.config, sample_input())
    lock = StreamPaths(TAP, "users").lock(local_lake.manifest("users")["files"][0]["schema_hash"])
    local_lake.storage.write(
        lock, json.dumps({"writer-id": "w-1", "acquired": iso_ms(0), "refreshed": iso_ms(0), "lease_seconds": 60}).encode()
    )
    listed = json.loads(run_cli(local_lake, "locks", "--json").stdout)
    assert [(entry["path"], entry["writer_id"], entry["stale"]) for entry in listed] == [(lock, "w-1", True)]
    refused = run_cli(local_lake, "locks", "--break", lock)
    assert refused.returncode == 2 and "--force" in refused.stderr and local_lake.storage.exists(lock)
    assert run_cli(local_lake, "locks", "--break", lock, "--force").returncode == 0
    assert not local_lake.storage.exists(lock)


def test_describe_shows_versions_with_a_readable_diff(local_lake):
    land(local_lake.config, sample_input())
    result = run_cli(local_lake, "describe")
    assert result.returncode == 0, result.stderr
    assert "+ email: string" in result.stdout and "- name" in result.stdout
    report = json.loads(run_cli(local_lake, "ls", "--json").stdout)
    users = report["taps"][TAP]["users"]
    assert users["records"] == 58 and users["versions"][1]["changes"] == ["+ email: string", "- name"]


@pytest.mark.heavy
def test_jobs_run_on_a_local_cluster(local_lake, cli_session):
    land(local_lake.config, sample_input(), batch_max_rows=5)
    before = stored_lines(local_lake)
    cli = cli_session(local_lake, master="local-cluster[2,1,1024]")  # one cluster start for both commands
    compacted = cli.run("compact", "--json")
    assert compacted.returncode == 0, compacted.stderr[-3000:]
    assert sum(r["groups"] for r in json.loads(compacted.stdout)["streams"]) > 0
    checked = cli.run("verify")
    assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
    assert stored_lines(local_lake) == before


def test_progress_reports_files_and_bytes_when_shown(local_lake, spark, capsys):
    from singerlake.cli.output import JobProgress

    land(local_lake.config, sample_input(), batch_max_rows=10)
    files = [f for stream in ("users", "public.orders") for f in local_lake.manifest(stream)["files"]]
    assert verify(open_lake(local_lake), spark, progress=JobProgress("verify")) == []
    shown = capsys.readouterr().err
    total_mib = sum(f["size"] for f in files) / (1 << 20)
    assert f"verify: files {len(files)}/{len(files)}, bytes {total_mib:,.1f}/{total_mib:,.1f} MiB" in shown
