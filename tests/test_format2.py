"""Lake format 2.0 (SPEC.md §5, §11-§13): a small root in front of immutable parts.

- property: random commits, activations, compactions, vacuums and a rebuild, read from random
  bookmarks and time windows, give exactly what reading the whole manifest (1.x style) gives;
- a commit's storage requests and bytes do not grow with the stream (moto's HTTP S3);
- a lake written by the 1.x code is read, upgraded by the real CLI, and its bookmarks still hold;
- a 1.x reader refuses a 2.0 root.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from singerlake.commits.commit import commit_files, register_writer, write_manifest
from singerlake.format import manifest as manifest_module
from singerlake.format.datafile import write_data_file
from singerlake.format.errors import InvalidMetadata
from singerlake.format.layout import StreamPaths
from singerlake.format.manifest import Manifest
from singerlake.format.needs import properties_of
from singerlake.format.positions import Position
from singerlake.format.scan import scan_stream
from singerlake.format.schema_hash import schema_hash
from singerlake.jobs.compact import merge_group, merged_runs, plan_groups, swap_in
from singerlake.jobs.vacuum import vacuum_stream
from singerlake.lake import Lake
from singerlake.replay.stream import Activate, Lines, Reached, StreamReplay, Window
from singerlake.storage import LocalStorage, S3Storage, Storage
from support.storage import Counting

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}
HASH = schema_hash(SCHEMA, [])
SCHEMA_LINE = json.dumps({"type": "SCHEMA", "stream": "s", "schema": SCHEMA, "key_properties": []}).encode()
PATHS = StreamPaths("tap", "s")
LAKE_1_1 = Path(__file__).parent / "data" / "lake-1.1"
SINGERLAKE = str(Path(sys.executable).parent / "singerlake")


def record(n: int) -> bytes:
    return b'{"type":"RECORD","stream":"s","record":{"n":%d},"time_extracted":"%s"}' % (n, _iso(n).encode())


def _iso(n: int) -> str:
    return f"2024-01-01T{n // 3600:02d}:{n // 60 % 60:02d}:{n % 60:02d}.000Z"


def events(storage: Storage, manifest: Manifest, after: Position | None = None, window: Window | None = None) -> list:
    """What a reader emits, with the final position: the thing every planned read must reproduce."""
    found = [e for e in StreamReplay(storage, manifest, after, window).events() if not isinstance(e, Reached)]
    final = [e for e in StreamReplay(storage, manifest, after, window).events() if isinstance(e, Reached)][-1]
    return [*found, final]


def whole(manifest: Manifest) -> Manifest:
    """The same stream as one 1.x-style manifest: every file and activation inline, no parts."""
    return Manifest(
        manifest.tap_id,
        manifest.stream,
        manifest.versions,
        manifest.files,
        manifest.commits,
        manifest.writers,
        manifest.activate_versions,
        generation=manifest.generation,
    )


def compact_now(lake: Lake, target_bytes: int) -> None:
    """The compaction job's own steps (plan, merge, swap), without Spark scheduling them."""
    manifest = lake.manifest("tap", "s")
    items = [
        {
            "tap_id": "tap",
            "stream": "s",
            "schema_hash": HASH,
            "properties": properties_of(manifest.versions[HASH]["schema"]),
            "files": [e for e, _ in g],
            "runs": merged_runs(g),
            "work_id": "compact",
        }
        for g in plan_groups(manifest, target_bytes)
    ]
    if items:
        swap_in(lake, "tap", "s", [(item, merge_group(lake.storage, 1, item)) for item in items], manifest)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("commit"), st.lists(st.integers(1, 4), min_size=1, max_size=3)),
            st.tuples(st.just("activate"), st.integers(1, 9)),
            st.tuples(st.just("compact"), st.integers(60, 400)),
            st.tuples(st.just("vacuum"), st.just(0)),
        ),
        min_size=3,
        max_size=24,
    ),
    rebuild=st.booleans(),
    picks=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 200), st.integers(0, 200)), min_size=4, max_size=8),
)
def test_planned_reads_equal_whole_manifest_reads(steps, rebuild, picks):
    with tempfile.TemporaryDirectory() as root, pytest.MonkeyPatch.context() as patch:
        patch.setattr(manifest_module, "TAIL_FILE_BYTES", 900)  # a part every few files
        patch.setattr(manifest_module, "TAIL_ACTIVATION_BYTES", 150)
        storage = LocalStorage(root)
        lake = Lake(storage)
        register_writer(storage, PATHS, HASH, "w")
        lines: list[bytes] = []
        for kind, arg in steps:
            if kind == "commit":
                entries = []
                for size in arg:
                    chunk = [record(len(lines) + i) for i in range(size)]
                    entries.append(write_data_file(storage, PATHS, HASH, SCHEMA_LINE, chunk, [0] * size))
                    lines += [line + b"\n" for line in chunk]
                commit_files(storage, PATHS, entries, {HASH: (SCHEMA, [])}, writer_id="w")
            elif kind == "activate":
                lake.update_manifest(PATHS, lambda m, v=arg: m.add_activation(v, "2024-01-01T00:00:00.000Z"))
            elif kind == "compact":
                compact_now(lake, arg)
            else:
                vacuum_stream(lake, PATHS, 0, True, 2**62)
        manifest = lake.manifest("tap", "s")
        reference = whole(manifest)
        assert [line for e in events(storage, reference) if isinstance(e, Lines) for line in e.data.splitlines(True)] == lines
        if rebuild:
            vacuum_stream(lake, PATHS, 0, True, 2**62)  # a rebuild adopts what is on storage (SPEC.md §12)
            rebuilt = scan_stream(storage, PATHS)
            rebuilt.start_generation()
            write_manifest(storage, PATHS, rebuilt)
            manifest = lake.manifest("tap", "s")
            reference = whole(manifest)
        marks = [e.position for e in StreamReplay(storage, reference).events() if isinstance(e, Reached)]
        ends = [e.position for e in StreamReplay(storage, reference).events() if isinstance(e, Reached)]
        assert Position(*manifest.end_position()) <= ends[-1]  # files only; an activation may sit after the last record
        for fraction, low, width in picks:
            after = marks[int(fraction * (len(marks) - 1))]
            window = Window(low * 1000, (low + width) * 1000)
            for bookmark, span in ((after, None), (None, window), (after, window)):
                assert events(storage, manifest, bookmark, span) == events(storage, reference, bookmark, span)


def _stream_of(storage: Storage, files: int) -> tuple[Manifest, str]:
    register_writer(storage, PATHS, HASH, "w")
    manifest = None
    for n in range(files):
        entry = write_data_file(storage, PATHS, HASH, SCHEMA_LINE, [record(n)], [0])
        manifest = commit_files(storage, PATHS, [entry], {HASH: (SCHEMA, [])}, writer_id="w", last=manifest)
    return manifest, "w"


def test_a_commit_costs_one_request_and_a_small_root_however_long_the_stream(s3_root, monkeypatch):
    """Warm 1-file commits on S3: one conditional write each, two when the commit seals the tail
    into a part; no part is ever read; the root stays at the tail's bound whatever the history."""
    monkeypatch.setattr(manifest_module, "TAIL_FILE_BYTES", 4000)  # ~8 files a part: 60 commits make parts
    url, options = s3_root
    s3_storage = S3Storage(url, **options)
    counting = Counting(s3_storage)
    manifest, writer = _stream_of(s3_storage, 60)
    assert len(manifest.parts) >= 5
    sizes = []
    for n in range(20):
        entry = write_data_file(s3_storage, PATHS, HASH, SCHEMA_LINE, [record(100 + n)], [0])
        counting.clear()
        manifest = commit_files(counting, PATHS, [entry], {HASH: (SCHEMA, [])}, writer_id=writer, last=manifest)
        parts = [call for call in counting.requests if "/_manifest/" in call[1]]
        assert all(method == "write" for method, _ in parts), "a commit never reads a part"
        assert counting.requests == [("write", p) for _, p in parts] + [("write", PATHS.manifest)]
        assert len(counting.requests) <= 2
        sizes.append(len(manifest.stored.data))
    assert max(sizes) < 4000 + 3000, sizes  # tail bound + summaries + versions: not the 80 files' entries
    assert len(Lake(s3_storage).manifest("tap", "s").files) == 80


def test_a_bookmark_at_the_end_reads_the_root_only(storage, monkeypatch):
    monkeypatch.setattr(manifest_module, "TAIL_FILE_BYTES", 4000)
    _stream_of(storage, 40)
    counting = Counting(storage)
    manifest = Lake(counting).manifest("tap", "s")
    end = Position(*manifest.end_position(), manifest.generation)
    assert events(counting, manifest, end)[:-1] == []
    assert [c for c in counting.requests if "/_manifest/" in c[1]] == [], "no part opened"
    start = manifest.parts[2]["commits"][0]  # from the middle: only the parts from there on
    replay = StreamReplay(counting, manifest, Position(start, 0, manifest.generation))
    assert len([e for e in replay.events() if isinstance(e, Lines)]) > 0
    assert replay.parts_opened == len(manifest.parts) - 2


def test_idempotent_retry_finds_ids_sealed_into_a_part(tmp_path, monkeypatch):
    monkeypatch.setattr(manifest_module, "TAIL_FILE_BYTES", 2000)
    storage = LocalStorage(tmp_path)
    register_writer(storage, PATHS, HASH, "w")
    first = write_data_file(storage, PATHS, HASH, SCHEMA_LINE, [record(0)], [0])
    commit_files(storage, PATHS, [first], {HASH: (SCHEMA, [])}, writer_id="w")
    for n in range(1, 12):  # seals `first` into a part
        commit_files(
            storage, PATHS, [write_data_file(storage, PATHS, HASH, SCHEMA_LINE, [record(n)], [0])], {HASH: (SCHEMA, [])}, writer_id="w"
        )
    before = Lake(storage).manifest("tap", "s")
    assert first["id"] not in {e["id"] for e in before.tail} and before.parts
    again = commit_files(storage, PATHS, [first], {HASH: (SCHEMA, [])}, writer_id="w")
    assert again.commits == before.commits and len(again.files) == 12


def _load_1x_manifest_module():
    spec = importlib.util.spec_from_file_location("manifest_1_1", Path(__file__).parent / "data" / "manifest_1_1.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_1x_reader_refuses_a_2_0_root_naming_it(tmp_path):
    storage = LocalStorage(tmp_path)
    _stream_of(storage, 3)
    old = _load_1x_manifest_module()
    with pytest.raises(InvalidMetadata, match=r"manifest.json: field 'format' must be 'singerlake-manifest', got 'singerlake-manifest-v2'"):
        old.Manifest.from_bytes(storage.read(PATHS.manifest).data, storage.url_of(PATHS.manifest))


def _all_positions(storage: Storage, manifest: Manifest) -> list[tuple[Position, list]]:
    """Every bookmark a full replay reports, with what a rerun from it emits."""
    marks = [e.position for e in StreamReplay(storage, manifest).events() if isinstance(e, Reached)]
    return [(mark, events(storage, manifest, mark)) for mark in marks]


def test_a_lake_written_by_1x_is_read_upgraded_in_place_and_bookmarks_still_hold(tmp_path):
    root = tmp_path / "lake"
    shutil.copytree(LAKE_1_1, root)
    storage = LocalStorage(root)
    lake = Lake(storage)
    streams = ("users", "public.orders")
    roots = {s: storage.read(lake.paths("tap-old", s).manifest).data for s in streams}
    assert all(b'"format":"singerlake-manifest"' in data for data in roots.values())
    before = {s: _all_positions(storage, lake.manifest("tap-old", s)) for s in streams}  # a 2.0 reader reads 1.x
    assert any(isinstance(e, Activate) for s in streams for e in before[s][0][1])

    dry = subprocess.run([SINGERLAKE, "upgrade", str(root), "--json"], capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert {u["stream"] for u in json.loads(dry.stdout)["streams"]} == set(streams)
    assert {s: storage.read(lake.paths("tap-old", s).manifest).data for s in streams} == roots, "a dry run changes nothing"

    done = subprocess.run([SINGERLAKE, "upgrade", str(root), "--apply"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "2 streams upgraded" in done.stdout
    for stream in streams:
        manifest = lake.manifest("tap-old", stream)
        assert manifest.read_format == "singerlake-manifest-v2"
        assert _all_positions(storage, manifest) == before[stream], f"{stream}: bookmarks taken before the upgrade"
    assert len(lake.manifest("tap-old", "users").replaced_files()) == 4  # the 1.x compaction's sources, for vacuum
    assert json.loads(storage.read("raw/singerlake.json").data)["spec_version"] == "2.0"
    again = subprocess.run([SINGERLAKE, "upgrade", str(root), "--apply"], capture_output=True, text=True)
    assert "nothing to upgrade" in again.stdout
    verify = subprocess.run([SINGERLAKE, "verify", str(root), "--no-hashes"], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_newer_format_is_refused_by_name_and_never_rebuilt(tmp_path):
    """A manifest, part or singerlake.json written by a newer Singerlake is refused (SPEC.md §13), and
    repair leaves it alone instead of rewriting it as 2.0."""
    from singerlake.format.errors import NewerFormat

    lake = Lake.open(str(tmp_path / "lake"))
    _stream_of(lake.storage, 3)
    key = PATHS.manifest
    doc = json.loads(lake.storage.read(key).data)
    newer = json.dumps({**doc, "spec_version": "2.3"}).encode()
    lake.storage.write(key, newer)
    with pytest.raises(NewerFormat, match=r"manifest.json: written under lake format 2.3, newer than the 2.2"):
        lake.manifest(PATHS.tap_id, PATHS.stream)
    cli = subprocess.run(
        [sys.executable, "-m", "singerlake.cli", "repair", str(tmp_path / "lake"), "--apply"], capture_output=True, text=True
    )
    assert cli.returncode != 0 and "Traceback" not in cli.stderr
    assert "newer than the 2.2" in cli.stderr
    assert lake.storage.read(key).data == newer  # untouched
