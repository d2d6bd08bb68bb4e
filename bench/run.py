"""Benchmarks of target-singerlake and tap-singerlake beside their PyPI peers, measured in the same run.

Each peer runs from its own venv under bench/out/venvs (created on first use). Input is the
`users` stream of bench/gen_users.py. Prints one table: wall time, peak RSS of the whole process
tree (Python + JVM + Spark workers) and the ratios to our plugin of the same kind.

- targets: each lands the Singer file from stdin (ours into a fresh local lake);
- taps: each replays the same 1M records to /dev/null: ours from a lake landed by our target
  (landed once, not timed), tap-singer-jsonl from the Singer file, tap-jsonl from the records as
  plain JSONL.

Usage: python bench/run.py [--only target|tap] [--records 1000000] [--scale-records 5000000]
                           [--no-peers] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from measure import Measurement, measure

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
VENVS = OUT / "venvs"
BIN = Path(sys.executable).parent
TARGET_PEERS = {"target-singer-jsonl": "target-singer-jsonl==0.1.0", "target-jsonl": "target-jsonl==0.1.4"}
TAP_PEERS = {"tap-singer-jsonl": "tap-singer-jsonl==0.1.0", "tap-jsonl": "tap-jsonl==0.3.1"}


# -- inputs (cached in bench/out) ------------------------------------------------------------------
def singer_file(records: int) -> Path:
    path = OUT / f"users-{records}.singer.jsonl"
    if not path.exists():
        OUT.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".tmp"), "wb") as handle:
            subprocess.run([sys.executable, str(HERE / "gen_users.py"), str(records)], stdout=handle, check=True)
        path.with_suffix(".tmp").rename(path)
    return path


def records_file(records: int) -> Path:
    """The same records as plain JSONL (one record object per line), for tap-jsonl."""
    path = OUT / f"users-{records}.records.jsonl"
    if not path.exists():
        with open(singer_file(records), "rb") as source, open(path.with_suffix(".tmp"), "wb") as out:
            for line in source:
                message = json.loads(line)
                if message["type"] == "RECORD":
                    out.write(json.dumps(message["record"]).encode() + b"\n")
        path.with_suffix(".tmp").rename(path)
    return path


def landed_lake(records: int) -> Path:
    """A lake holding the stream, landed by target-singerlake (once)."""
    lake = OUT / f"lake-{records}"
    if not (lake / "raw" / "singerlake.json").exists():
        shutil.rmtree(lake, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=OUT) as tmp:
            result = ours_target(singer_file(records), Path(tmp), lake)
        if result.returncode != 0:
            raise SystemExit("target-singerlake failed to land the tap benchmark's lake")
    return lake


def peer_executable(name: str) -> Path:
    venv = VENVS / name
    exe = venv / "bin" / name
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", {**TARGET_PEERS, **TAP_PEERS}[name]], check=True)
    return exe


def run(name: str, exe: Path, flag: str, config: dict, work: Path, stdin: Path | None = None) -> Measurement:
    config_path = work / f"{name}.json"
    config_path.write_text(json.dumps(config))
    result = measure([str(exe), flag, str(config_path)], str(stdin) if stdin else None)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed with exit code {result.returncode}")
    return result


# -- targets ---------------------------------------------------------------------------------------
def ours_target(source: Path, work: Path, lake: Path | None = None) -> Measurement:
    lake = lake or work / "lake"
    shutil.rmtree(lake, ignore_errors=True)
    return run("target-singerlake", BIN / "target-singerlake", "--config", {"lake_root": str(lake), "tap_id": "tap-bench"}, work, source)


def peer_target(name: str, source: Path, work: Path) -> Measurement:
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    config = (
        {"destination": "local", "local": {"folder": str(folder)}} if name == "target-singer-jsonl" else {"destination_path": str(folder)}
    )
    return run(name, peer_executable(name), "-c", config, work, source)


# -- taps ------------------------------------------------------------------------------------------
def ours_tap(records: int, work: Path) -> Measurement:
    config = {"lake_root": str(landed_lake(records)), "tap_id": "tap-bench"}
    return run("tap-singerlake", BIN / "tap-singerlake", "--config", config, work)


def peer_tap(name: str, records: int, work: Path) -> Measurement:
    if name == "tap-singer-jsonl":
        folder = work / "singer-files"
        folder.mkdir(exist_ok=True)
        (folder / "users.singer.jsonl").unlink(missing_ok=True)
        (folder / "users.singer.jsonl").symlink_to(singer_file(records))
        config = {"source": "local", "local": {"folders": [str(folder)]}, "add_record_metadata": False}
        return run(name, peer_executable(name), "-c", config, work)
    config = {"path": str(records_file(records)), "stream_name": "users", "primary_keys": ["id"]}
    return run(name, peer_executable(name), "--config", config, work)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["target", "tap"], help="run only the target or only the tap benchmarks")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--scale-records", type=int, default=0, help="also run our plugins alone on this many records")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="runs of our plugins; the best wall time is reported")
    args = parser.parse_args()
    n = args.records
    rows: list[tuple[str, int, Measurement, Measurement]] = []  # (plugin, records, measurement, ours of its kind)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        work = Path(tmp)
        if args.only in (None, "target"):
            best = min((ours_target(singer_file(n), work) for _ in range(args.repeat)), key=lambda m: m.wall_s)
            rows.append(("target-singerlake", n, best, best))
            for name in [] if args.no_peers else TARGET_PEERS:
                rows.append((name, n, peer_target(name, singer_file(n), work), best))
            if args.scale_records:
                rows.append(("target-singerlake", args.scale_records, ours_target(singer_file(args.scale_records), work), best))
        if args.only in (None, "tap"):
            landed_lake(n)
            best = min((ours_tap(n, work) for _ in range(args.repeat)), key=lambda m: m.wall_s)
            rows.append(("tap-singerlake", n, best, best))
            for name in [] if args.no_peers else TAP_PEERS:
                rows.append((name, n, peer_tap(name, n, work), best))
            if args.scale_records:
                landed_lake(args.scale_records)
                rows.append(("tap-singerlake", args.scale_records, ours_tap(args.scale_records, work), best))
    size_mb = singer_file(n).stat().st_size / 2**20
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; input {n:,} records, {size_mb:.0f} MiB"
    )
    print("| plugin | records | wall s | peak RSS MiB | records/s | wall / ours | RSS / ours |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, count, m, ours in rows:
        print(
            f"| {name} | {count:,} | {m.wall_s:.1f} | {m.peak_rss_mb:.0f} | {count / m.wall_s:,.0f} | "
            f"{m.wall_s / ours.wall_s:.2f} | {m.peak_rss_mb / ours.peak_rss_mb:.2f} |"
        )


if __name__ == "__main__":
    main()
