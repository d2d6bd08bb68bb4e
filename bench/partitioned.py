"""`singerlake project --partition-by` beside the same projection unpartitioned and DuckDB's partitioned COPY.

Input: the bench `users` stream with `created_at`, a date-time spread over 365 days (bench/gen_users.py
--spread-days 365), landed once by the real target-singerlake. Each round, on fresh copies of that lake,
its peers in turn (their order alternating between rounds), each a separate process (bench/measure.py):

- singerlake: `singerlake project LAKE` (unpartitioned), the figure the partitioned one is held to;
- singerlake by day: `singerlake project LAKE --partition-by users=created_at:day`, then the run after
  10 updated keys are landed, 5 of them moved a day later (their rows change partition);
- duckdb: the current row per id of the same files, as bench/project.py's peer computes it, with
  `created_at_day` added, `COPY ... (FORMAT parquet, PARTITION_BY (created_at_day))`.

Then a one-day `SELECT count(*)` by DuckDB's `delta_scan`, in this process, on the two tables of the
last round, the two queries taking turns: `WHERE created_at_day = D` on the partitioned one, `WHERE
created_at >= D AND created_at < D + 1 day` on the other (best of --queries, the min–max), and the
share of the table's files the one-day filter plans (delta-rs). Goals beside the figures (10M: first
projection within 1.1× the unpartitioned and 1.5× DuckDB; the update within Spark start + one task +
4 s; the one-day query on ≤ 1% of the files and ≥ 10× faster than unpartitioned).

Usage: python bench/partitioned.py [--records 1000000] [--repeat 3] [--queries 5] [--landed DIR] [--publish]
       python bench/partitioned.py --peer PLAN OUT   (DuckDB's run, invoked by the bench)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import streams
from lakes import TAP_ID, land, updates
from measure import Measurement
from project import landed_once, ordered_files, raw_mib, spread, sql_text
from published import published

HERE = Path(__file__).resolve().parent
DAY = "2025-07-01"
BY_DAY = ["--partition-by", "users=created_at:day"]


def spread_file(records: int) -> Path:
    """The users stream with ``created_at`` over 365 days (cached in bench/out)."""
    path = streams.OUT / f"users-{records}-365d.singer.jsonl"
    if not path.exists():
        with open(path.with_suffix(".tmp"), "wb") as handle:
            subprocess.run([sys.executable, str(HERE / "gen_users.py"), str(records), "--spread-days", "365"], stdout=handle, check=True)
        path.with_suffix(".tmp").rename(path)
    return path


def duckdb_peer(plan: list, out: Path) -> None:
    """The current row per id (last file, then last line), partitioned by the UTC day of ``created_at``."""
    import duckdb

    ((_, files),) = plan
    listed = "[" + ", ".join(map(sql_text, files)) + "]"
    duckdb.connect().execute(f"""
        COPY (
            SELECT record.*, CAST(substr(CAST(record.created_at AS VARCHAR), 1, 10) AS DATE) AS created_at_day FROM (
                SELECT record, list_position({listed}, filename) AS file, row_number() OVER () AS line
                FROM read_ndjson({listed}, filename = true) WHERE type = 'RECORD'
            ) QUALIFY row_number() OVER (PARTITION BY record.id ORDER BY file DESC, line DESC) = 1
        ) TO {sql_text(str(out))} (FORMAT parquet, PARTITION_BY (created_at_day))""")


def duckdb_run(lake: Path, work: Path) -> Measurement:
    plan, out = work / "plan.json", work / "out-duckdb"
    plan.write_text(json.dumps(ordered_files(lake)))
    subprocess.run(["rm", "-rf", str(out)], check=True)
    return streams.logged("duckdb", [sys.executable, __file__, "--peer", str(plan), str(out)], work)


def singerlake_run(name: str, lake: Path, work: Path, *options: str) -> Measurement:
    return streams.logged(name, [streams.CLI, "project", str(lake), *options], work)


def one_day_queries(queries: list[tuple[Path, str]], repeat: int) -> list[tuple[list[float], int]]:
    """Wall times of one-day count(*)s by DuckDB's delta_scan (a fresh connection each), and their counts: the
    queries take turns, so a noisy moment of the machine falls on both alike."""
    import duckdb

    wheels = glob.glob(f"{os.path.dirname(duckdb.__file__)}/../duckdb_ext/extensions/v*/*/*")
    extensions = {os.path.basename(path).split(".")[0]: path for path in wheels}
    if "delta" not in extensions:
        raise SystemExit(f"no delta extension for DuckDB {duckdb.__version__}: pip install duckdb-ext-delta of the same version")
    times: list[list[float]] = [[] for _ in queries]
    counts = [0] * len(queries)
    for _ in range(repeat):
        for number, (table, where) in enumerate(queries):
            connection = duckdb.connect(config={"allow_unsigned_extensions": "true"})
            connection.execute(f"LOAD '{extensions['delta']}'")
            started = time.perf_counter()
            counts[number] = connection.execute(f"SELECT count(*) FROM delta_scan({sql_text(str(table))}) WHERE {where}").fetchone()[0]
            times[number].append(time.perf_counter() - started)
            connection.close()
    return list(zip(times, counts, strict=True))


def file_share(table: Path) -> tuple[int, int]:
    from deltalake import DeltaTable

    delta = DeltaTable(str(table))
    return len(delta.file_uris(file_pruning_predicate=[("created_at_day", "=", DAY)])), len(delta.file_uris())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--queries", type=int, default=5)
    parser.add_argument("--landed", type=Path, help="keep the landed input in this folder, reuse it later")
    parser.add_argument("--peer", nargs=2, metavar=("PLAN", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        duckdb_peer(json.loads(Path(args.peer[0]).read_text()), Path(args.peer[1]))
        return
    streams.OUT.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[Measurement]] = {}
    with tempfile.TemporaryDirectory(prefix="partitioned-", dir=streams.OUT) as tmp:
        work = Path(tmp)
        source = spread_file(args.records)
        landed = landed_once((args.landed or work) / f"users-{args.records}-365d", source, work)
        change = updates(source, 10, work / "updates.jsonl", moved=5)
        peers = ("singerlake", "singerlake by day", "duckdb")
        for round_ in range(args.repeat):
            for peer in peers if round_ % 2 == 0 else peers[::-1]:
                lake = streams.fresh_copy(landed, work / ("lake-by-day" if peer == "singerlake by day" else f"lake-{peer}"))
                if peer == "duckdb":
                    runs.setdefault(peer, []).append(duckdb_run(lake, work))
                elif peer == "singerlake":
                    runs.setdefault(peer, []).append(singerlake_run(peer, lake, work))
                else:
                    runs.setdefault(peer, []).append(singerlake_run(peer, lake, work, *BY_DAY))
                    land(lake, change, work)
                    runs.setdefault("update", []).append(singerlake_run("update", lake, work, *BY_DAY))
            runs.setdefault("baseline", []).append(streams.baseline(work))
        table = lambda name: work / name / "published" / TAP_ID / "users"  # noqa: E731
        day = f"TIMESTAMPTZ '{DAY} 00:00:00+00'"
        in_day = f"created_at >= {day} AND created_at < {day} + INTERVAL 1 DAY"
        queries = [(table("lake-by-day"), f"created_at_day = DATE '{DAY}'"), (table("lake-singerlake"), in_day)]
        by_day, plain = one_day_queries(queries, args.queries)
        planned, files = file_share(table("lake-by-day"))
        print_table(args, raw_mib(landed), runs, by_day, plain, planned, files)


def print_table(args, mib: float, runs: dict, by_day: tuple, plain: tuple, planned: int, files: int) -> None:
    best = {name: min(m.wall_s for m in measured) for name, measured in runs.items()}
    rss = {name: min(m.peak_rss_mb for m in measured) for name, measured in runs.items()}
    ten_m = args.records >= 10_000_000
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; load average at the end {load}")
    print(f"users × {args.records:,} with created_at over 365 days ({mib:.1f} MiB raw); best of {args.repeat} (min–max)\n")
    print("| case | wall s | peak RSS MiB | ratio | goal (10M) | met |")
    print("|---|---:|---:|---:|---|---|")
    first, unpartitioned, duck = best["singerlake by day"], best["singerlake"], best["duckdb"]
    met = lambda ok: ("yes" if ok else "no") if ten_m else "(10M goal)"  # noqa: E731
    rows = [
        ("singerlake, unpartitioned, first projection", "singerlake", "", "", ""),
        ("singerlake by day, first projection", "singerlake by day", f"{first / unpartitioned:.2f} × unpart., {first / duck:.2f} × DuckDB",
         "≤ 1.1× unpartitioned, ≤ 1.5× DuckDB", met(first <= 1.1 * unpartitioned and first <= 1.5 * duck)),
        ("DuckDB COPY … PARTITION_BY (created_at_day)", "duckdb", "", "", ""),
        ("singerlake by day, after 10 updated keys (5 move a day)", "update", f"{best['update'] - best['baseline']:+.1f} s vs baseline",
         "≤ Spark start + one task + 4 s", met(best["update"] <= best["baseline"] + 4)),
        (streams.BASELINE_LABEL, "baseline", "", "", ""),
    ]  # fmt: skip
    for label, name, ratio, goal, ok in rows:
        print(f"| {label} | {spread([m.wall_s for m in runs[name]], 1)} | {rss[name]:.0f} | {ratio} | {goal} | {ok} |")
    (day_times, day_count), (plain_times, plain_count) = by_day, plain
    speedup = min(plain_times) / min(day_times)
    print(f"\none-day `SELECT count(*)` (DuckDB delta_scan, {DAY}; best of {args.queries}, min–max):\n")
    print("| table | rows counted | files planned | wall ms | goal | met |")
    print("|---|---:|---:|---:|---|---|")
    share = f"{planned} of {files} ({100 * planned / files:.2f}%)"
    print(f"| by day (`created_at_day = DATE '{DAY}'`) | {day_count:,} | {share} | {1000 * min(day_times):.1f} "
          f"({1000 * min(day_times):.1f}–{1000 * max(day_times):.1f}) | ≤ 1% of files, ≥ 10× faster | "
          f"{'yes' if planned <= 0.01 * files else 'no'}; {speedup:.1f}× {'yes' if speedup >= 10 else 'no'} |")  # fmt: skip
    print(f"| unpartitioned (`created_at` in the day) | {plain_count:,} | all | {1000 * min(plain_times):.1f} "
          f"({1000 * min(plain_times):.1f}–{1000 * max(plain_times):.1f}) | | |")  # fmt: skip
    if day_count != plain_count:
        raise SystemExit(f"the two tables count {day_count} and {plain_count} rows for {DAY}")


if __name__ == "__main__":
    with published("partitioned"):
        main()
