"""Small work on a large lake: `singerlake project`, `ls` and `docs` with nothing new, and after 10 of its
streams changed, on a lake of 10,000 streams × 5 records (Spark local[*], local lake), this version beside an
earlier one (``--before REV``: checked out into a temporary worktree, run with its core first on the path) in
the same run.

Both get the same lake: landed once by target-singerlake (bench/gen_streams.py's tables), projected, listed
and documented once by each version on its own copy (`ls` with a cache folder of its own, `docs --out` a site
of its own); each round then lands the same 10-stream increment into both copies (not timed) and times each
version's `project`, `ls` and `docs` after it, then each once more with nothing new. Rounds alternate which
version goes first.

Usage: python bench/changes.py [--streams 10000] [--repeat 3] [--before c767d44]
(``--streams 300 --repeat 1`` checks it works in a few minutes.)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from lakes import land
from measure import measure
from streams import Shape, singer_file

REPO = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).parent / "singerlake")
COMMANDS = ("project", "ls", "docs")
CASES = ("nothing new", "10 streams changed")
GOALS = {("project", CASES[0]): 1.0, ("project", CASES[1]): 3.0, ("docs", CASES[0]): 5.0, ("docs", CASES[1]): 5.0}  # seconds


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """The core of ``rev``, in a temporary worktree (removed after)."""
    place = Path(tempfile.mkdtemp(prefix="singerlake-before-"))
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(place / "tree"), rev], check=True, capture_output=True)
    try:
        yield place / "tree" / "shared"
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(place / "tree")], check=False, capture_output=True)
        shutil.rmtree(place, ignore_errors=True)


def timed(command: str, lake: Path, core: Path | None, log: Path) -> float:
    """``singerlake COMMAND`` on ``lake`` (``ls`` with the lake's own cache folder, ``docs`` into the lake's own site)."""
    env = {**os.environ, **({"PYTHONPATH": str(core)} if core else {}), "SINGERLAKE_CACHE_DIR": f"{lake}-cache"}
    extra = ["--out", f"{lake}-site"] if command == "docs" else []
    with open(log, "ab") as stderr:
        result = measure([CLI, command, str(lake), *extra, "--json"], None, stderr=stderr, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{command} failed ({result.returncode}): see {log}")
    return result.wall_s


def spread(runs: list[float]) -> str:
    return f"{min(runs):.2f} s ({min(runs):.2f}–{max(runs):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", default="c767d44", help="the earlier version to compare with")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "singerlake-bench-changes")
    args = parser.parse_args()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    landed = work / "landed"
    print(f"landing {args.streams:,} streams × 5 records ...", flush=True)
    land(landed, singer_file(Shape(f"{args.streams}x5", args.streams, 5)), work)
    with checkout(args.before) as before_core:
        versions = {"this version": None, f"before ({args.before})": before_core}
        lakes = {name: work / f"lake-{index}" for index, name in enumerate(versions)}
        for name, lake in lakes.items():
            shutil.copytree(landed, lake)
            for command in COMMANDS:
                print(f"{name}: first {command} {timed(command, lake, versions[name], work / f'{command}.log'):.1f} s", flush=True)
        times: dict[tuple[str, str, str], list[float]] = {}
        for round_number in range(args.repeat):
            increment = singer_file(Shape("10x5", 10, 5, first_id=1_000 + 10 * round_number))
            order = list(versions) if round_number % 2 == 0 else list(reversed(versions))
            for name in order:
                land(lakes[name], increment, work)
                for case in reversed(CASES):  # after the increment, then with nothing new
                    for command in COMMANDS:
                        wall_s = timed(command, lakes[name], versions[name], work / f"{command}.log")
                        times.setdefault((name, command, case), []).append(wall_s)
    print(f"\n{args.streams:,} streams × 5 records, local lake, Spark local[*]; {platform.node()}, {os.cpu_count()} cores")
    print(f"`singerlake COMMAND`, process start to exit, best of {args.repeat} (spread):\n")
    print("| command | case | this version | before | ratio | goal | met |")
    print("|---|---|---:|---:|---:|---|---|")
    before = f"before ({args.before})"
    for command in COMMANDS:
        for case in CASES:
            now, then = times[("this version", command, case)], times[(before, command, case)]
            goal = GOALS.get((command, case))
            met = ("yes" if min(now) <= goal else "no") if goal else "–"
            limit = f"≤ {goal:g} s" if goal else "–"
            print(f"| {command} | {case} | {spread(now)} | {spread(then)} | {min(then) / min(now):.1f}× faster | {limit} | {met} |")


if __name__ == "__main__":
    main()
