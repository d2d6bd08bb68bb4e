"""Lake-job benchmarks: `singerlake compact` of 10,000 small files and `singerlake verify` of a stream
with 100,000 files, each run as the real command (Spark local[*]) and measured for wall time and
peak RSS of its process tree. The small-file streams are written with the core (as 10,000 tiny
batches of a target would leave them), 50 records per file.

Usage: python bench/jobs.py [--compact-files 10000] [--verify-files 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from measure import measure
from singerlake import Lake
from singerlake.format.datafile import write_data_file
from singerlake.format.layout import StreamPaths
from singerlake.format.manifest import Manifest
from singerlake.format.schema_hash import schema_hash
from singerlake.storage import LocalStorage

OUT = Path(__file__).resolve().parent / "out"
CLI = str(Path(sys.executable).parent / "singerlake")
SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"}, "at": {"type": "string", "format": "date-time"}},
}
PER_FILE = 50


def small_files_lake(root: Path, files: int) -> float:
    """A lake with one stream of ``files`` files of PER_FILE records, one commit each; returns seconds taken."""
    started = time.perf_counter()
    shutil.rmtree(root, ignore_errors=True)
    storage = LocalStorage(root)
    paths = StreamPaths("tap-bench", "events")
    digest = schema_hash(SCHEMA, ["id"])
    schema_line = json.dumps({"type": "SCHEMA", "stream": "events", "schema": SCHEMA, "key_properties": ["id"]}).encode() + b"\n"

    def write(number: int) -> dict:
        lines = [
            b'{"type":"RECORD","stream":"events","record":{"id":%d,"name":"user %d","at":"2024-01-01T00:00:00Z"}}\n' % (n, n)
            for n in range(number * PER_FILE, (number + 1) * PER_FILE)
        ]
        return write_data_file(storage, paths, digest, schema_line, lines, [1_704_067_200_000 + number] * PER_FILE)

    with ThreadPoolExecutor(8) as pool:
        entries = list(pool.map(write, range(files)))
    manifest = Manifest("tap-bench", "events")
    manifest.add_version(digest, SCHEMA, ["id"], 0)
    # One commit per file, as many tiny batches would leave them (built directly: append_commit is per batch).
    manifest.files = [{**entry, "commit": number} for number, entry in enumerate(sorted(entries, key=lambda e: e["id"]), 1)]
    manifest.commits = len(entries)
    storage.write(paths.manifest, manifest.to_bytes())
    Lake(storage).publish_stream(manifest)
    return time.perf_counter() - started


def run(*args: str) -> tuple:
    result = measure([CLI, *args, "--json"], None)
    if result.returncode not in (0, 1):
        raise SystemExit(f"singerlake {args[0]} failed with exit code {result.returncode}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compact-files", type=int, default=10_000)
    parser.add_argument("--verify-files", type=int, default=100_000)
    args = parser.parse_args()
    rows = []
    root = OUT / "jobs-lake"
    built = small_files_lake(root, args.compact_files)
    compacted = run("compact", str(root))
    files_after = len(Lake.open(str(root)).manifest("tap-bench", "events").files)
    rows.append(
        (f"compact {args.compact_files:,} files of {PER_FILE} records", compacted, f"{args.compact_files:,} -> {files_after} files")
    )
    checked = run("verify", str(root))
    rows.append((f"verify after compaction ({files_after} files + {args.compact_files:,} replaced)", checked, f"exit {checked.returncode}"))

    built_verify = small_files_lake(root, args.verify_files)
    verified = run("verify", str(root))
    rows.append((f"verify a stream of {args.verify_files:,} files (hashes on Spark)", verified, f"exit {verified.returncode}"))
    quick = run("verify", str(root), "--no-hashes")
    rows.append((f"verify {args.verify_files:,} files, --no-hashes", quick, f"exit {quick.returncode}"))
    shutil.rmtree(root, ignore_errors=True)

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"(setup, not timed: {args.compact_files:,} files written in {built:.1f} s, {args.verify_files:,} in {built_verify:.1f} s)")
    print("| job | wall s | peak RSS MiB | files/s | result |")
    print("|---|---:|---:|---:|---|")
    for (label, m, result), files in zip(rows, [args.compact_files, args.compact_files, args.verify_files, args.verify_files], strict=True):
        print(f"| {label} | {m.wall_s:.1f} | {m.peak_rss_mb:.0f} | {files / m.wall_s:,.0f} | {result} |")


if __name__ == "__main__":
    main()
