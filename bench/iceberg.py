"""Iceberg beside Delta (#24): `singerlake project` of the same landed lake with `--formats delta` and
with `--formats delta,iceberg` (a SQLite catalog), first projection and a run after 10 updated keys,
each the real command (Spark local[*]), wall time and peak RSS of its process tree, best of N and the
spread, the two taken alternately in the same run.

Usage: python bench/iceberg.py [--records 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lakes import land, updates
from measure import measure
from published import published

BENCH = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
FORMATS = {"delta": ["--formats", "delta"], "delta+iceberg": ["--formats", "delta,iceberg", "--iceberg-catalog", "bench"]}


def project(lake: Path, formats: str, catalog: Path):
    env = {
        **os.environ,
        "PYICEBERG_CATALOG__BENCH__TYPE": "sql",
        "PYICEBERG_CATALOG__BENCH__URI": f"sqlite:///{catalog}",
        "PYICEBERG_CATALOG__BENCH__WAREHOUSE": f"file://{lake}",
    }
    result = measure([str(BIN / "singerlake"), "project", str(lake), *FORMATS[formats]], None, env=env)
    if result.returncode != 0:
        raise SystemExit(f"singerlake project --formats {formats} failed (exit {result.returncode})")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-iceberg-"))
    try:
        source = work / "users.jsonl"
        with open(source, "wb") as out:
            subprocess.run([sys.executable, str(BENCH / "gen_users.py"), str(args.records)], stdout=out, check=True)
        landed = work / "landed"
        land(landed, source, work)
        change = updates(source, 10, work / "updates.jsonl")
        times: dict[tuple[str, str], list] = {}
        for round_ in range(args.repeat):
            for formats in FORMATS if round_ % 2 == 0 else reversed(list(FORMATS)):
                lake = work / f"lake-{formats}-{round_}"
                shutil.copytree(landed, lake)
                catalog = work / f"catalog-{formats}-{round_}.db"
                times.setdefault(("first projection", formats), []).append(project(lake, formats, catalog))
                land(lake, change, work)
                times.setdefault(("after 10 updated keys", formats), []).append(project(lake, formats, catalog))
                shutil.rmtree(lake)
        print(f"\n{args.records:,} records, best of {args.repeat} (spread), load average {os.getloadavg()[0]:.1f}\n")
        print("| run | delta | delta+iceberg | ratio | peak RSS delta / delta+iceberg |")
        print("|---|---:|---:|---:|---:|")
        for run in ("first projection", "after 10 updated keys"):
            best = {f: min(m.wall_s for m in times[(run, f)]) for f in FORMATS}
            spread = {f: max(m.wall_s for m in times[(run, f)]) for f in FORMATS}
            rss = {f: min(m.peak_rss_mb for m in times[(run, f)]) for f in FORMATS}
            print(
                f"| {run} | {best['delta']:.1f} s ({best['delta']:.1f}-{spread['delta']:.1f}) "
                f"| {best['delta+iceberg']:.1f} s ({best['delta+iceberg']:.1f}-{spread['delta+iceberg']:.1f}) "
                f"| {best['delta+iceberg'] / best['delta']:.2f}x | {rss['delta']:.0f} / {rss['delta+iceberg']:.0f} MiB |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    with published("iceberg"):
        main()
