"""Small landings on a warm Spark (one local Spark Connect server kept between runs) against a cold
local[*] Spark and target-singer-jsonl, each process timed from start to exit, in the same run.

    .venv/bin/python bench/warm.py [--repeat 5]

Rows: 10 records (warm, cold, target-singer-jsonl) and 300 streams × 200 records (warm,
target-singer-jsonl); best of --repeat, the spread, and the ratio to target-singer-jsonl.
Goals: 10 records on the warm server ≤ 1 s; 300 × 200 there ≤ 2× target-singer-jsonl. Then the
warm server's memory (RSS of its JVM, and with its Python workers) after the runs and idle. The server
is private to the bench (its own discovery directory) and stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from measure import Measurement, measure, tree_rss
from run import peer_target
from streams import MANY, SHAPES, singer_file

BIN = Path(sys.executable).parent
GOAL_10_S = 1.0
GOAL_300_RATIO = 2.0


def land(source: Path, work: Path, env: dict) -> Measurement:
    shutil.rmtree(work / "lake", ignore_errors=True)
    config = work / "target.json"
    config.write_text(json.dumps({"lake_root": str(work / "lake"), "tap_id": "tap-bench"}))
    with open(work / "target.log", "wb") as log:
        result = measure([str(BIN / "target-singerlake"), "--config", str(config)], str(source), env=env, stderr=log)
    if result.returncode != 0:
        raise SystemExit((work / "target.log").read_text()[-3000:] + f"\ntarget-singerlake failed ({result.returncode})")
    return result


def spark(env: dict, action: str) -> str:
    done = subprocess.run([str(BIN / "singerlake"), "spark", action, "--json"], capture_output=True, text=True, env=env)
    if done.returncode not in (0, 1):
        raise SystemExit(done.stderr)
    return done.stdout


def row(label: str, runs: list[Measurement], peer: list[Measurement] | None, goal: str = "") -> str:
    walls = [m.wall_s for m in runs]
    ratio = f"{min(walls) / min(m.wall_s for m in peer):5.2f}x" if peer else "      "
    return f"{label:<44} {min(walls):6.2f} s  {min(walls):.2f}–{max(walls):.2f}  {ratio}  {goal}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    small, many = singer_file(SHAPES["10"]), singer_file(MANY)
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        work = Path(tmp)
        cold = {k: v for k, v in os.environ.items() if k not in ("SINGERLAKE_SPARK_WARM", "SPARK_REMOTE")}
        warm = {**cold, "SINGERLAKE_SPARK_WARM": "true", "SPARK_LOCAL_CONNECT_DISCOVERY": str(work / "warm" / "connect-local.json")}
        started = time.perf_counter()
        spark(warm, "start")
        start_s = time.perf_counter() - started
        try:
            land(small, work, warm)  # the server's first session for this core: ships it and checks the executors once
            results: dict[str, list[Measurement]] = {k: [] for k in ("warm10", "cold10", "peer10", "warm300", "peer300")}
            for _ in range(args.repeat):  # interleaved: a machine's slow minute falls on all
                results["warm10"].append(land(small, work, warm))
                results["cold10"].append(land(small, work, cold))
                results["peer10"].append(peer_target("target-singer-jsonl", small, work))
            for _ in range(args.repeat):
                results["warm300"].append(land(many, work, warm))
                results["peer300"].append(peer_target("target-singer-jsonl", many, work))
            jvm = psutil.Process(json.loads(spark(warm, "status"))["pid"])
            after_runs = jvm.memory_info().rss / 2**20, tree_rss(jvm) / 2**20
            time.sleep(150)  # idle: Spark ends idle workers after a minute, their daemons end a minute later
            idle = jvm.memory_info().rss / 2**20, tree_rss(jvm) / 2**20
        finally:
            spark(warm, "stop")
    best10 = min(m.wall_s for m in results["warm10"])
    ratio300 = min(m.wall_s for m in results["warm300"]) / min(m.wall_s for m in results["peer300"])
    print(f"warm Spark start (singerlake spark start): {start_s:.1f} s; best of {args.repeat}, spread, ratio to target-singer-jsonl")
    print(row("10 records, target-singerlake, warm Spark", results["warm10"], results["peer10"], goal_text(best10 <= GOAL_10_S, "≤ 1 s")))
    print(row("10 records, target-singerlake, cold local[*]", results["cold10"], results["peer10"]))
    print(row("10 records, target-singer-jsonl", results["peer10"], results["peer10"]))
    print(
        row(
            "300 × 200, target-singerlake, warm Spark",
            results["warm300"],
            results["peer300"],
            goal_text(ratio300 <= GOAL_300_RATIO, "≤ 2x"),
        )
    )
    print(row("300 × 200, target-singer-jsonl", results["peer300"], results["peer300"]))
    for when, (jvm_mib, tree_mib) in (("just after the runs", after_runs), ("idle 150 s later", idle)):
        print(f"warm Spark {when}: JVM RSS {jvm_mib:,.0f} MiB; with its Python workers {tree_mib:,.0f} MiB")


def goal_text(met: bool, goal: str) -> str:
    return f"goal {goal}: {'met' if met else 'NOT met'}"


if __name__ == "__main__":
    main()
