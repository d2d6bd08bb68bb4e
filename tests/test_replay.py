"""The replay core (SPEC.md §11) on hand-built manifests: bookmarks resume exactly, before and after
a compaction rewrites the files, on the local backend and HTTP S3 (moto, SeaweedFS)."""

from __future__ import annotations

import json
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from singerlake.format.datafile import write_data_file
from singerlake.format.errors import BadBookmark
from singerlake.format.layout import StreamPaths
from singerlake.format.manifest import Manifest
from singerlake.format.positions import Position
from singerlake.format.schema_hash import schema_hash
from singerlake.replay.stream import Activate, Lines, Reached, Schema, StreamReplay
from singerlake.storage import LocalStorage, Storage

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}
HASH = schema_hash(SCHEMA, [])
SCHEMA_LINE = json.dumps({"type": "SCHEMA", "stream": "s", "schema": SCHEMA, "key_properties": []}).encode() + b"\n"
PATHS = StreamPaths("tap", "s")


def record(n: int) -> bytes:
    return b'{"type":"RECORD","stream":"s","record":{"n":%d}}\n' % n


def build(storage: Storage, commits: list[list[int]]) -> tuple[Manifest, list[bytes]]:
    """A manifest whose commit i holds files of the given sizes; records are numbered in order."""
    manifest = Manifest("tap", "s")
    manifest.add_version(HASH, SCHEMA, [], 0)
    lines: list[bytes] = []
    for sizes in commits:
        entries = []
        for size in sizes:
            chunk = [record(len(lines) + i) for i in range(size)]
            entries.append(write_data_file(storage, PATHS, HASH, SCHEMA_LINE, chunk, [1000] * size))
            lines += chunk
        manifest.append_commit(entries)
    return manifest, lines


def compact(storage: Storage, manifest: Manifest, groups: list[int]) -> Manifest:
    """Merge consecutive files into groups of the given sizes, each file keeping its records' positions."""
    runs_of_files = []
    seen: dict[int, int] = {}
    for entry in manifest.files:
        runs_of_files.append({"commit": entry["commit"], "first": seen.get(entry["commit"], 0), "records": entry["records"]})
        seen[entry["commit"]] = seen.get(entry["commit"], 0) + entry["records"]
    new_files, index = [], 0
    compacted = Manifest.from_dict(manifest.to_dict(), "test")
    compacted.commits += 1
    for size in groups:
        group = manifest.files[index : index + size]
        runs = runs_of_files[index : index + size]
        index += size
        if not group:
            break
        lines = [
            line for entry in group for line in replay_lines(storage, Manifest("tap", "s", manifest.versions, [entry], entry["commit"]))
        ]
        merged = write_data_file(storage, PATHS, HASH, SCHEMA_LINE, lines, [1000] * len(lines))
        new_files.append({**merged, "commit": compacted.commits, "runs": runs})
    leftover = [dict(e) for e in manifest.files[index:]]
    compacted.tail = new_files + leftover
    return Manifest.from_dict(compacted.to_dict(), "compacted")  # the manifest stays valid


def replay_lines(storage: Storage, manifest: Manifest, after: Position | None = None) -> list[bytes]:
    return [line for e in StreamReplay(storage, manifest, after).events() if isinstance(e, Lines) for line in e.data.splitlines(True)]


def bookmarks(storage: Storage, manifest: Manifest) -> list[tuple[Position, int]]:
    """Each bookmark a replay reports, with how many records were emitted before it."""
    emitted, found = 0, []
    for event in StreamReplay(storage, manifest).events():
        if isinstance(event, Lines):
            emitted += event.data.count(b"\n")
        elif isinstance(event, Reached):
            found.append((event.position, emitted))
    return found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    commits=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=3), min_size=1, max_size=6),
    groups=st.lists(st.integers(1, 5), min_size=1, max_size=8),
)
def test_every_bookmark_resumes_exactly_before_and_after_compaction(commits, groups):
    with tempfile.TemporaryDirectory() as root:
        storage = LocalStorage(root)
        manifest, lines = build(storage, commits)
        assert replay_lines(storage, manifest) == lines
        marks = bookmarks(storage, manifest)
        compacted = compact(storage, manifest, groups)
        assert replay_lines(storage, compacted) == lines  # same records, same order
        for position, emitted in marks:
            assert replay_lines(storage, manifest, position) == lines[emitted:]
            assert replay_lines(storage, compacted, position) == lines[emitted:]  # nothing twice, nothing lost


def test_activate_version_is_placed_after_its_commit_and_not_repeated(tmp_path):
    storage = LocalStorage(tmp_path)
    manifest, lines = build(storage, [[2], [3]])
    manifest.tail_activations = [{"version": 5, "after_commit": 1, "records": 2}, {"version": 6, "after_commit": 2, "records": 3}]
    events = list(StreamReplay(storage, manifest).events())
    kinds = [type(e).__name__ for e in events if not isinstance(e, (Reached, Schema))]
    assert kinds == ["Lines", "Activate", "Lines", "Activate"]
    after_first = [e.position for e in events if isinstance(e, Reached)][1]  # after ACTIVATE_VERSION 5
    again = [e for e in StreamReplay(storage, manifest, after_first).events() if isinstance(e, Activate)]
    assert again == [Activate(6)]


def test_a_bookmark_beyond_the_lake_is_rejected_naming_the_stream(storage):
    manifest, _ = build(storage, [[1]])
    with pytest.raises(BadBookmark, match="stream 's'.*commit 9.*clear the stream's state"):
        StreamReplay(storage, manifest, Position(9, 0))


def test_replay_reads_remote_files_the_same_way(storage):
    manifest, lines = build(storage, [[3, 2], [4]])
    assert replay_lines(storage, manifest) == lines
    assert replay_lines(storage, manifest, Position(1, 4)) == lines[4:]
