"""Concurrent commits to one stream's manifest, over a temp dir and S3 over HTTP (moto, SeaweedFS) (SPEC.md §9).

Each writer is a separate OS process (a ``python -c`` child that loads this file), holding the
lock of its own stream-schema and committing fenced, one data file per commit; and writers of one
stream-schema, some holding its lock for several commits, some committing once without it (§9).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from singerlake.commits.commit import claim_writer, commit_files, register_writer, update_manifest
from singerlake.commits.errors import CommitRejected, LockNeeded
from singerlake.commits.lock import Lock
from singerlake.format.datafile import write_data_file
from singerlake.format.layout import StreamPaths
from singerlake.format.schema_hash import schema_hash
from singerlake.lake import Lake
from singerlake.landing.writer import SchemaWriter
from singerlake.times import now_ms
from support.children import open_spec, run_together, spawn

TAP = "tap-concurrency"
STREAM = "events"


def _schema(name: str) -> tuple[dict, list[str], str, bytes]:
    """A schema of its own per writer: (schema, key properties, schema hash, SCHEMA line)."""
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, name: {"type": "string"}}}
    keys = ["id"]
    line = json.dumps({"type": "SCHEMA", "stream": STREAM, "schema": schema, "key_properties": keys}).encode()
    return schema, keys, schema_hash(schema, keys), line


def _write(storage, paths: StreamPaths, schema_hash_: str, schema_line: bytes, n: int) -> dict:
    line = json.dumps({"type": "RECORD", "stream": STREAM, "record": {"id": n}}).encode()
    return write_data_file(storage, paths, schema_hash_, schema_line, [line], [now_ms()])


# -- many writers, one manifest ---------------------------------------------------------------------


def _commit_child(spec: dict, name: str, commits: int, out: str, absent: bool = False) -> None:
    storage = open_spec(spec)
    paths = StreamPaths(TAP, STREAM)
    schema, keys, hash_, line = _schema(name)
    lock = Lock(storage, paths.lock(hash_), lease_s=60, drift_s=10, wait_s=30)
    storage.exists(paths.manifest)  # connect before the start signal
    print("ready", flush=True)
    sys.stdin.readline()
    lock.acquire()
    if absent:
        # Every writer believes the stream is new (its run listed the tap before anyone wrote), so each
        # creates the manifest unread, registered in it; all but one lose that create and read it.
        update_manifest(storage, paths, lambda manifest: claim_writer(manifest, hash_, lock.writer_id), absent=True)
    # Otherwise each registers in its first commit (SPEC.md §9).
    done = []
    for n in range(commits):
        record = _write(storage, paths, hash_, line, n)
        manifest = commit_files(storage, paths, [record], {hash_: (schema, keys)}, writer_id=lock.writer_id)
        (entry,) = [e for e in manifest.files if e["id"] == record["id"]]
        done.append({**record, "commit": entry["commit"]})
    assert lock.release() is True
    Path(out).write_text(json.dumps({"writer_id": lock.writer_id, "schema_hash": hash_, "files": done}))


@pytest.mark.parametrize("absent", [False, True], ids=["known", "all-think-new"])
def test_concurrent_writers_append_every_commit_exactly_once(lake_spec, tmp_path, absent):
    writers, commits = 4, 50
    outs = [tmp_path / f"writer-{n}.json" for n in range(writers)]
    children = [spawn(__file__, "_commit_child", lake_spec, f"field_{n}", commits, str(out), absent) for n, out in enumerate(outs)]
    run_together(children, timeout=300)
    results = [json.loads(out.read_text()) for out in outs]

    manifest = Lake(open_spec(lake_spec)).manifest(TAP, STREAM)  # parses and validates the stored manifest
    total = writers * commits
    assert manifest.commits == total
    assert len(manifest.files) == total
    assert len(manifest.file_ids()) == total
    numbers = [entry["commit"] for entry in manifest.files]
    assert numbers == list(range(1, total + 1))  # one file per commit, strictly increasing in list order

    by_id = {entry["id"]: entry for entry in manifest.files}
    assert set(by_id) == {f["id"] for r in results for f in r["files"]}
    for result in results:
        # Every commit a writer saw succeed is in the manifest, as it was committed, in the writer's order.
        for committed in result["files"]:
            assert by_id[committed["id"]] == committed
        mine = [f["commit"] for f in result["files"]]
        assert mine == sorted(mine) and len(set(mine)) == commits
        assert manifest.writers[result["schema_hash"]]["writer_id"] == result["writer_id"]
    assert len(manifest.versions) == writers
    assert sorted(info["version"] for info in manifest.versions.values()) == sorted(f"v{n}" for n in range(1, writers + 1))


# -- all or nothing -----------------------------------------------------------------------------------


def test_commit_of_several_files_is_all_or_nothing(lake_spec):
    storage = open_spec(lake_spec)
    lake = Lake(storage)
    paths = StreamPaths(TAP, STREAM)
    schema, keys, hash_, line = _schema("mine")
    other_schema, other_keys, other_hash, other_line = _schema("theirs")
    schemas = {hash_: (schema, keys), other_hash: (other_schema, other_keys)}

    with (
        Lock(storage, paths.lock(hash_), lease_s=30, drift_s=5) as lock,
        Lock(storage, paths.lock(other_hash), lease_s=30, drift_s=5) as other,
    ):
        register_writer(storage, paths, hash_, lock.writer_id)
        register_writer(storage, paths, other_hash, other.writer_id)
        first = _write(storage, paths, hash_, line, 0)
        commit_files(storage, paths, [first], schemas, writer_id=lock.writer_id)
        before = storage.read(paths.manifest)

        records = [_write(storage, paths, hash_, line, n) for n in (1, 2, 3)]
        ids = {r["id"] for r in records}

        def unchanged() -> None:
            assert storage.read(paths.manifest) == before  # same bytes, same etag: nothing was written
            manifest = lake.manifest(TAP, STREAM)
            assert manifest.commits == 1 and not ids & manifest.file_ids()

        # A writer id that is not the registered writer: the whole commit is refused.
        with pytest.raises(CommitRejected):
            commit_files(storage, paths, records, schemas, writer_id="writer-stale")
        unchanged()
        # Files of a stream-schema this writer does not own spoil the whole commit, not just their part.
        foreign = _write(storage, paths, other_hash, other_line, 4)
        with pytest.raises(CommitRejected):
            commit_files(storage, paths, [*records, foreign], schemas, writer_id=lock.writer_id)
        assert foreign["id"] not in lake.manifest(TAP, STREAM).file_ids()
        unchanged()
        # A record whose schema is not given: refused before anything is written.
        with pytest.raises(ValueError):
            commit_files(storage, paths, records, {other_hash: schemas[other_hash]}, writer_id=lock.writer_id)
        unchanged()
        for record in records:
            assert storage.exists(record["path"])  # written, yet invisible

        # The rightful writer: all three files in one new commit.
        manifest = commit_files(storage, paths, records, schemas, writer_id=lock.writer_id)
        stored = lake.manifest(TAP, STREAM)
        for m in (manifest, stored):
            assert m.commits == 2
            assert [e["id"] for e in m.files][0] == first["id"]
            assert {e["id"] for e in m.files[1:]} == ids
            assert [e["commit"] for e in m.files] == [1, 2, 2, 2]
        # Retrying the same commit (e.g. after a lost response) adds nothing.
        commit_files(storage, paths, records, schemas, writer_id=lock.writer_id)
        again = lake.manifest(TAP, STREAM)
        assert again.commits == 2 and len(again.files) == 4


# -- runs under the lock and single commits without it -----------------------------------------------

RUN_MESSAGE = {"type": "SCHEMA", "stream": STREAM, "schema": {"type": "object", "properties": {"id": {"type": "integer"}}}}


def _run_child(spec: dict, runs: int, commits: int, out: str) -> None:
    """``runs`` landings of one stream-schema: with ``commits`` > 1 each holds the lock for all its commits;
    with 1, each commits without it while no lock exists (SPEC.md §9), else takes it and commits under it.
    Writes, per run, the ids of the files it committed and whether the lock was taken."""
    lake = Lake(open_spec(spec))
    lake.storage.exists(StreamPaths(TAP, STREAM).manifest)  # connect before the start signal
    print("ready", flush=True)
    sys.stdin.readline()
    done = []
    for run in range(runs):
        writer = SchemaWriter(lake, TAP, RUN_MESSAGE, lease_s=60, drift_s=10, wait_s=120)
        writer.look()
        line = json.dumps({"type": "RECORD", "stream": STREAM, "record": {"id": run}}).encode()
        files = [
            write_data_file(lake.storage, writer.paths, writer.schema_hash, writer.schema_line, [line], [now_ms()]) for _ in range(commits)
        ]
        if commits == 1:
            try:
                writer.commit_unlocked(files, lambda manifest: 0, 0)
                done.append({"ids": [files[0]["id"]], "locked": False})
                continue
            except LockNeeded:
                pass
        writer.take()
        for file in files:
            writer.commit([file], publish=False)
        writer.close()
        done.append({"ids": [file["id"] for file in files], "locked": True})
    Path(out).write_text(json.dumps(done))


def test_single_commits_without_the_lock_never_land_inside_a_locked_run(lake_spec, tmp_path):
    storage = open_spec(lake_spec)
    with SchemaWriter(Lake(storage), TAP, RUN_MESSAGE) as first:  # the stream has a manifest
        line = json.dumps({"type": "RECORD", "stream": STREAM, "record": {"id": 0}}).encode()
        first.commit([first.write_file([line], [now_ms()])])
    shapes = [(6, 4), (6, 4), (30, 1), (30, 1)]  # (runs, commits a run) per child
    outs = [tmp_path / f"child-{n}.json" for n in range(len(shapes))]
    run_together(
        [spawn(__file__, "_run_child", lake_spec, runs, commits, str(out)) for (runs, commits), out in zip(shapes, outs, strict=True)], 600
    )

    runs = [run for out in outs for run in json.loads(out.read_text())]
    commit_of = {entry["id"]: entry["commit"] for entry in Lake(storage).manifest(TAP, STREAM).files}
    assert len(commit_of) == 1 + sum(len(run["ids"]) for run in runs), "every commit once"
    for run in (run for run in runs if len(run["ids"]) > 1):
        numbers = [commit_of[file_id] for file_id in run["ids"]]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), f"a locked run's commits are consecutive: {numbers}"
    single = [run for run in runs if len(run["ids"]) == 1]
    print(f"{sum(not run['locked'] for run in single)} of {len(single)} single commits went without the lock")
    assert any(not run["locked"] for run in single), "some single commits found no lock"
    assert [info.key for info in storage.list(f"{StreamPaths(TAP, STREAM).stream_dir}/") if info.key.endswith(".lock")] == []
