"""Metadata at scale (issue #13): one stream of N committed files, then what a commit and a read cost.

    python bench/metadata.py --root DIR --files 1000000 --tap T --stream S [--tap-run] [--verify]

Builds the stream through the core's public API: a registered writer, then ``commit_many`` (each
file its own commit, sealed exactly as one-by-one commits would be; one root write per 10,000
commits), data files spread over a year (synthetic: every file holds the same one record; they
are hard links to one file, as creating a million real files takes longer than the rest). Then
measures, on the built lake: one more 1-file commit (warm, as a target's writer does it),
planning a read from a bookmark at the end and of a one-day window, the root's
size (the bytes a commit rewrites) and reading the whole manifest. ``--tap-run`` times
tap-singerlake from that bookmark beside the same run on a one-file lake; ``--verify`` times
``singerlake verify --no-hashes``. The last line is JSON whose ``state`` is a tap-singerlake
state positioned at the end of the stream.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from singerlake.commits.commit import commit_files, commit_many, register_writer
from singerlake.format.layout import PART_DIR, StreamPaths
from singerlake.format.metadata import blake2_hex, make_record
from singerlake.format.names import normalise_label
from singerlake.format.schema_hash import schema_hash
from singerlake.lake import Lake
from singerlake.replay.stream import Window
from singerlake.storage import LocalStorage
from singerlake.times import new_file_id

YEAR_MS = 365 * 24 * 3600 * 1000
T0 = 1_700_000_000_000
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
COMMITS_PER_WRITE = 10_000
BIN = Path(sys.executable).parent


def synthetic_file(stream: str) -> bytes:
    schema_line = json.dumps({"type": "SCHEMA", "stream": stream, "schema": SCHEMA, "key_properties": ["id"]}).encode()
    record = json.dumps({"type": "RECORD", "stream": stream, "record": {"id": 1, "name": "x"}}).encode()
    return gzip.compress(schema_line + b"\n" + record + b"\n", mtime=0)


def entry_for(paths: StreamPaths, data: bytes, digest: str, start: int, end: int) -> dict:
    file_id = new_file_id(start)
    return make_record(
        file_id=file_id,
        path=paths.data_file(schema_hash(SCHEMA, ["id"]), start, end, file_id),
        where=normalise_label(paths.tap_id),
        what=normalise_label(paths.stream),
        start=start,
        end=end,
        content_hash=digest,
        size=len(data),
        records=1,
        schema_hash=schema_hash(SCHEMA, ["id"]),
        work_id="bench",
    )


def build(root: Path, tap: str, stream: str, files: int, data_files: bool) -> tuple[Lake, StreamPaths, str, float]:
    storage = LocalStorage(root)
    lake = Lake(storage)
    paths = lake.paths(tap, stream)
    hash_ = schema_hash(SCHEMA, ["id"])
    schemas = {hash_: (SCHEMA, ["id"])}
    writer_id = f"writer-{new_file_id()}"
    lake.ensure_names(paths)
    register_writer(storage, paths, hash_, writer_id)
    data = synthetic_file(stream)
    digest = blake2_hex(data)
    step = YEAR_MS // files
    started = time.perf_counter()
    for first in range(0, files, COMMITS_PER_WRITE):
        batch = [
            entry_for(paths, data, digest, T0 + i * step, T0 + i * step + step // 2)
            for i in range(first, min(files, first + COMMITS_PER_WRITE))
        ]
        if data_files:  # hard links to one file of the same bytes: creating 1M real files takes far longer
            source = root / f".bench-data-{first // 60_000}"  # ext4 allows 65,000 links per inode
            if not source.exists():
                source.write_bytes(data)
            (root / batch[0]["path"]).parent.mkdir(parents=True, exist_ok=True)
            for entry in batch:
                os.link(source, root / entry["path"])
        manifest = commit_many(storage, paths, [[entry] for entry in batch], schemas, writer_id=writer_id)
        print(f"  built {min(files, first + COMMITS_PER_WRITE):,} files, {len(manifest.parts)} parts", file=sys.stderr)
    lake.publish_stream(manifest)
    return lake, paths, writer_id, time.perf_counter() - started


def one_more_commits(lake: Lake, paths: StreamPaths, writer_id: str, count: int) -> dict:
    """``count`` warm 1-file commits, as a target's writer makes them: timings and bytes written."""
    storage = lake.storage
    hash_ = schema_hash(SCHEMA, ["id"])
    manifest = lake.manifest(paths.tap_id, paths.stream)
    known = storage.read(paths.manifest)
    manifest.stored = known  # as a writer holds it after its last commit
    data = synthetic_file(paths.stream)
    times, written = [], []
    parts_dir = lake.storage.root / paths.stream_dir / PART_DIR
    for n in range(count):
        start = T0 + YEAR_MS + n * 1000
        entry = entry_for(paths, data, blake2_hex(data), start, start)
        (lake.storage.root / entry["path"]).write_bytes(data)
        parts_before = set(os.listdir(parts_dir)) if parts_dir.exists() else set()
        began = time.perf_counter()
        manifest = commit_files(storage, paths, [entry], {hash_: (SCHEMA, ["id"])}, writer_id=writer_id, last=manifest)
        times.append(time.perf_counter() - began)
        known = manifest.stored
        new_parts = set(os.listdir(parts_dir)) - parts_before if parts_dir.exists() else set()
        written.append(len(known.data) + sum((parts_dir / name).stat().st_size for name in new_parts))
    return {"median_s": statistics.median(times), "max_s": max(times), "root_bytes": len(known.data), "max_bytes_written": max(written)}


def timed(work, repeat: int = 3) -> tuple[float, object]:
    best, result = None, None
    for _ in range(repeat):
        began = time.perf_counter()
        result = work()
        elapsed = time.perf_counter() - began
        best = elapsed if best is None else min(best, elapsed)
    return best, result


def run_tap(root: Path, tap: str, stream: str, state: dict) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        config, state_file = Path(tmp, "config.json"), Path(tmp, "state.json")
        config.write_text(json.dumps({"lake_root": str(root), "tap_id": tap, "streams": [stream]}))
        state_file.write_text(json.dumps(state))
        best = None
        for _ in range(3):
            began = time.perf_counter()
            done = subprocess.run(
                [str(BIN / "tap-singerlake"), "--config", str(config), "--state", str(state_file)], capture_output=True, check=True
            )
            elapsed = time.perf_counter() - began
            records = done.stdout.count(b'"type":"RECORD"') + done.stdout.count(b'"type": "RECORD"')
            assert records == 0, f"the tap emitted {records} records from a bookmark at the end"
            best = elapsed if best is None else min(best, elapsed)
        return best


def state_at_end(lake: Lake, tap: str, stream: str) -> dict:
    manifest = lake.manifest(tap, stream)
    commit, records = manifest.end_position()
    position = {"commit": commit, "records": records, **({"generation": manifest.generation} if manifest.generation else {})}
    return {"bookmarks": {stream: {"position": position}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True, help="an empty local directory for the lake")
    parser.add_argument("--files", type=int, required=True)
    parser.add_argument("--tap", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--no-data-files", action="store_true", help="metadata only (verify would report every file missing)")
    parser.add_argument("--commits", type=int, default=20, help="one-more commits to time")
    parser.add_argument("--tap-run", action="store_true", help="time tap-singerlake from the bookmark at the end, and on a 1-file lake")
    parser.add_argument("--verify", action="store_true", help="time singerlake verify --no-hashes")
    args = parser.parse_args()
    root = Path(args.root).absolute()
    if root.exists() and any(root.iterdir()):
        parser.error(f"--root {root} is not empty")
    lake, paths, writer_id, build_s = build(root, args.tap, args.stream, args.files, not args.no_data_files)
    figures: dict = {"files": args.files, "build_s": round(build_s, 1)}
    commit = one_more_commits(lake, paths, writer_id, args.commits)
    figures.update({f"commit_{k}": round(v, 4) if isinstance(v, float) else v for k, v in commit.items()})
    state = state_at_end(lake, args.tap, args.stream)
    end_commit = state["bookmarks"][args.stream]["position"]["commit"]
    figures["plan_at_end_s"], plan = timed(lambda: lake.manifest(args.tap, args.stream).plan(end_commit))
    figures["plan_at_end_parts_opened"] = plan.parts_opened
    day = Window(T0 + 180 * 86_400_000, T0 + 181 * 86_400_000)
    figures["plan_one_day_s"], plan = timed(lambda: lake.manifest(args.tap, args.stream).plan(None, day))
    figures["plan_one_day_parts_opened"] = plan.parts_opened
    figures["plan_one_day_files"] = sum(1 for entry in plan.files if not day.misses(entry))
    figures["whole_manifest_s"], whole = timed(lambda: len(lake.manifest(args.tap, args.stream).files), repeat=1)
    assert whole == args.files + args.commits, whole
    if args.tap_run:
        figures["tap_at_end_s"] = round(run_tap(root, args.tap, args.stream, state), 2)
        with tempfile.TemporaryDirectory() as tmp:
            small, small_paths, small_writer, _ = build(Path(tmp, "lake"), args.tap, args.stream, 1, True)
            figures["tap_at_end_1_file_lake_s"] = round(
                run_tap(Path(tmp, "lake"), args.tap, args.stream, state_at_end(small, args.tap, args.stream)), 2
            )
    if args.verify:
        began = time.perf_counter()
        done = subprocess.run([str(BIN / "singerlake"), "verify", str(root), "--no-hashes"], capture_output=True, text=True)
        figures["verify_no_hashes_s"] = round(time.perf_counter() - began, 1)
        figures["verify_exit"] = done.returncode
    for name, value in figures.items():
        print(f"{name:>28}: {value}")
    print(json.dumps({"figures": figures, "state": state}))


if __name__ == "__main__":
    main()
