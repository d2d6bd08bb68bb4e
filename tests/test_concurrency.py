"""Concurrent commits to one stream's manifest, over a temp dir and S3 over HTTP (moto, SeaweedFS) (SPEC.md §9).

Each writer is a separate OS process (a ``python -c`` child that loads this file), holding the
lock of its own stream-schema and committing fenced, one data file per commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from singerlake.commits.commit import claim_writer, commit_files, register_writer, update_manifest
from singerlake.commits.errors import CommitRejected
from singerlake.commits.lock import Lock
from singerlake.format.datafile import write_data_file
from singerlake.format.layout import StreamPaths
from singerlake.format.schema_hash import schema_hash
from singerlake.lake import Lake
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
