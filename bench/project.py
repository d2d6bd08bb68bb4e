"""`singerlake project` beside DuckDB and plain PySpark (#23), all on the same landed raw files.

Each input is landed once by the real target-singerlake (bench/lakes.py); every round then projects
a fresh copy of that lake with each peer in turn (their order alternating between rounds), each a
separate process measured for wall time and the peak RSS of its process tree (bench/measure.py):

- singerlake: the real `singerlake project LAKE` (Spark local[*]), Delta tables under published/;
- duckdb: `read_ndjson` of a stream's `*.singer.gz` files, the RECORD messages' fields, the latest
  row per `id` (`QUALIFY row_number() OVER (PARTITION BY id ORDER BY file, line DESC) = 1`),
  `COPY ... (FORMAT parquet)`; one query per stream, one process;
- pyspark: a plain session (local[*], Spark's defaults), `spark.read.json` of the same files,
  `row_number()` over a window per `id` ordered by file and `monotonically_increasing_id()`
  descending, `write.parquet`; one session looping over the streams.

The peers are given each stream's files in commit order (the manifest's, listed by the bench before
the run, untimed): file names sort by record time, which cannot tell an update's file from the
one it updates.

Cases: the `users` stream of bench/gen_users.py (each of --records): the first projection, then the
run after 10 records updating existing keys are landed (singerlake incrementally; the peers
recompute everything, as their users would); --streams SxR (bench/gen_streams.py): the first
projection of S streams of R records; and the baseline the goals count from, Spark start + one
Python task (bench/streams.py). One markdown table: the best of --repeat and the spread (min-max)
of wall time and peak RSS, ratios to DuckDB's best, the issue's goals beside singerlake's rows
(peak RSS: 1.5 GB = 1,431 MiB).

Usage: python bench/project.py [--records 1000000,10000000] [--streams 300x200] [--repeat 3] [--landed DIR] [--peers singerlake,duckdb]
       python bench/project.py --peer duckdb|pyspark PLAN OUT   (one peer's run, invoked by the bench)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import streams
from lakes import TAP_ID, land, updates
from measure import Measurement
from published import published
from run import singer_file as users_file

PEERS = ("singerlake", "duckdb", "pyspark")
RSS_GOAL_MIB = 1.5e9 / 2**20
TEN_M = 10_000_000


def ordered_files(lake: Path) -> list[tuple[str, list[str]]]:
    """Each stream of ``lake`` with its data files (absolute paths) in commit order."""
    from singerlake import Lake

    opened = Lake.open(str(lake))
    plan = []
    for stream in opened.streams(TAP_ID):
        files = sorted(opened.manifest(TAP_ID, stream).files, key=lambda entry: entry["commit"])
        plan.append((stream, [str(lake / entry["path"]) for entry in files]))
    return plan


def project(peer: str, lake: Path, work: Path) -> Measurement:
    """Every stream of ``lake`` projected by ``peer``, in a new process."""
    if peer == "singerlake":
        return streams.logged("singerlake project", [streams.CLI, "project", str(lake)], work)
    plan, out = work / "plan.json", work / f"out-{peer}"
    plan.write_text(json.dumps(ordered_files(lake)))
    shutil.rmtree(out, ignore_errors=True)
    return streams.logged(peer, [sys.executable, __file__, "--peer", peer, str(plan), str(out)], work)


def sql_text(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def duckdb_peer(plan: list, out: Path) -> None:
    """Per stream: the RECORD messages' fields, the latest row per id (last file, then last line), into one Parquet file."""
    import duckdb

    connection = duckdb.connect()
    out.mkdir(parents=True)
    for number, (_, files) in enumerate(plan):
        listed = "[" + ", ".join(map(sql_text, files)) + "]"
        connection.execute(f"""
            COPY (
                SELECT record.* FROM (
                    SELECT record, list_position({listed}, filename) AS file, row_number() OVER () AS line
                    FROM read_ndjson({listed}, filename = true) WHERE type = 'RECORD'
                ) QUALIFY row_number() OVER (PARTITION BY record.id ORDER BY file DESC, line DESC) = 1
            ) TO {sql_text(str(out / f"{number:04d}.parquet"))} (FORMAT parquet)""")


def pyspark_peer(plan: list, out: Path) -> None:
    """The same with a plain Spark session: the window per id ordered by file, then read order, descending."""
    from pyspark.sql import SparkSession, Window
    from pyspark.sql import functions as F

    spark = SparkSession.builder.master("local[*]").config("spark.ui.enabled", "false").getOrCreate()
    for number, (_, files) in enumerate(plan):
        rank = F.create_map(*[F.lit(value) for index, path in enumerate(files) for value in (Path(path).as_uri(), index)])
        records = spark.read.json(files).where("type = 'RECORD'")
        records = records.select("record", rank[F.input_file_name()].alias("_file"), F.monotonically_increasing_id().alias("_line"))
        latest = Window.partitionBy("record.id").orderBy(F.desc("_file"), F.desc("_line"))
        records = records.withColumn("_n", F.row_number().over(latest)).where("_n = 1")
        records.select("record.*").write.parquet(str(out / f"{number:04d}"))
    spark.stop()


def landed_once(lake: Path, source: Path, work: Path) -> Path:
    """``source`` landed in ``lake``, unless a previous run finished landing it there (its marker file exists)."""
    done = lake.with_name(lake.name + ".landed")
    if not done.exists():
        shutil.rmtree(lake, ignore_errors=True)
        land(lake, source, work)
        done.touch()
    return lake


def raw_mib(lake: Path) -> float:
    return sum(path.stat().st_size for path in lake.rglob("*.singer.gz")) / 2**20


def spread(runs: list[float], digits: int) -> str:
    return f"{min(runs):.{digits}f} ({min(runs):.{digits}f}–{max(runs):.{digits}f})"


def goals(kind: str, records: int, wall: float, ratio: float, rss: float, baseline: float | None) -> tuple[str, str]:
    """The issue's goals for a singerlake row of this ``kind`` of case, and whether they are met."""
    scale = "10M" if records >= TEN_M else "1M"
    rss_met = "yes" if rss <= RSS_GOAL_MIB else "no"
    if kind == "first":
        limit = 1.5 if records >= TEN_M else 2.0
        return f"≤ {limit:g}× DuckDB ({scale} goal); peak RSS ≤ 1.5 GB", f"{'yes' if ratio <= limit else 'no'}; {rss_met}"
    if kind == "update" and baseline is not None:
        limit = baseline + (4 if records >= TEN_M else 2)
        text = f"≤ Spark start + one task + {4 if records >= TEN_M else 2} s = {limit:.1f} s ({scale} goal); peak RSS ≤ 1.5 GB"
        return text, f"{'yes' if wall <= limit else 'no'}; {rss_met}"
    return "peak RSS ≤ 1.5 GB", rss_met


def print_table(cases: dict, meta: dict, repeat: int) -> None:
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; load average at the end {load}")
    print(f"best of {repeat} (min–max); ratios: best against DuckDB's best in this run\n")
    print("| case | peer | wall s | peak RSS MiB | wall / DuckDB | RSS / DuckDB | goal | met |")
    print("|---|---|---:|---:|---:|---:|---|---|")
    baseline = min((m.wall_s for m in cases.get("baseline", {}).get(streams.BASELINE_LABEL, [])), default=None)
    for case, runs in cases.items():
        kind, records = meta[case]
        duck = runs.get("duckdb")
        for peer, measured in runs.items():
            wall, rss = min(m.wall_s for m in measured), min(m.peak_rss_mb for m in measured)
            ratios, goal, met = " | ", "", ""
            if duck:
                ratio = wall / min(m.wall_s for m in duck)
                ratios = f"{ratio:.2f} | {rss / min(m.peak_rss_mb for m in duck):.2f}"
                if peer == "singerlake":
                    goal, met = goals(kind, records, wall, ratio, rss, baseline)
            walls, rsses = spread([m.wall_s for m in measured], 1), spread([m.peak_rss_mb for m in measured], 0)
            print(f"| {case} | {peer} | {walls} | {rsses} | {ratios} | {goal} | {met} |")


def parse_shape(text: str) -> streams.Shape | None:
    if not text:
        return None
    count, records = (int(part) for part in text.lower().split("x"))
    return streams.Shape(f"{count}x{records}", count, records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=lambda text: [int(n) for n in text.split(",") if n.strip()], default=[1_000_000])
    parser.add_argument("--streams", type=parse_shape, default="300x200", help="STREAMSxRECORDS, '' for none")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--peers",
        type=lambda text: [p for p in PEERS if p in text.split(",")],
        default=list(PEERS),
        help="which of singerlake,duckdb,pyspark run (all by default)",
    )
    parser.add_argument("--landed", type=Path, help="keep the landed inputs in this folder, reuse them later (landing 10M: ~15 min)")
    parser.add_argument("--peer", nargs=3, metavar=("duckdb|pyspark", "PLAN", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        peer, plan, out = args.peer
        {"duckdb": duckdb_peer, "pyspark": pyspark_peer}[peer](json.loads(Path(plan).read_text()), Path(out))
        return
    streams.OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="project-", dir=streams.OUT) as tmp:
        work = Path(tmp)
        cases: dict[str, dict[str, list[Measurement]]] = {}
        meta: dict[str, tuple[str, int]] = {"baseline": ("baseline", 0)}
        inputs = []  # (first case, case after updates or None, landed lake, updates or None)
        keep = args.landed or work
        for records in args.records:
            landed = landed_once(keep / f"users-{records}", users_file(records), work)
            first = f"users × {records:,} ({raw_mib(landed):.1f} MiB raw), first projection"
            after = f"users × {records:,}, after 10 updated keys"
            meta |= {first: ("first", records), after: ("update", records)}
            inputs.append((first, after, landed, updates(users_file(records), 10, work / f"updates-{records}.jsonl")))
        if args.streams:
            landed = landed_once(keep / args.streams.key, streams.singer_file(args.streams), work)
            first = f"{args.streams.label} ({raw_mib(landed):.1f} MiB raw), first projection"
            meta[first] = ("streams", args.streams.total)
            inputs.append((first, None, landed, None))
        for round_ in range(args.repeat):
            for first, after, landed, change in inputs:
                for peer in args.peers if round_ % 2 == 0 else args.peers[::-1]:
                    lake = streams.fresh_copy(landed, work / "lake")
                    cases.setdefault(first, {}).setdefault(peer, []).append(project(peer, lake, work))
                    if change:
                        land(lake, change, work)
                        cases.setdefault(after, {}).setdefault(peer, []).append(project(peer, lake, work))
            cases.setdefault("baseline", {}).setdefault(streams.BASELINE_LABEL, []).append(streams.baseline(work))
        print_table(cases, meta, args.repeat)


if __name__ == "__main__":
    with published("project"):
        main()
