"""What durability costs: landing and pushing into a local lake with the fsyncs of SPEC §9 (each durable
write's directory, a push's keys after its syncfs), beside a checkout of this repository without them
(--before DIR: its packages on PYTHONPATH, this venv's libraries), alternately, in the same run.

- landing: target-singerlake lands the `users` stream (--records, bench/gen_users.py) into a fresh lake;
- push: `singerlake push` of --files small files (1-20 KiB of random bytes) into a fresh lake.

Prints each case's best wall time with the spread, the ratio of the bests, and the ratio within each round
(both run one after the other, steadier when the machine's load moves); goal: ≤ 1.05.

Usage: python bench/durability.py --before DIR [--records 1000000] [--files 10000] [--repeat 3] [--publish]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import sys
import tempfile
from pathlib import Path

from measure import Measurement, measure
from project import spread
from published import published
from run import OUT, ours_target_at, singer_file

GOAL = 1.05


def small_files(count: int) -> Path:
    """``count`` files of 1-20 KiB of random bytes (cached in bench/out)."""
    folder = OUT / f"small-files-{count}"
    if not folder.exists():
        rng = random.Random(count)
        tmp = folder.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        for n in range(count):
            (tmp / f"{n % 100:02d}").mkdir(parents=True, exist_ok=True)
            (tmp / f"{n % 100:02d}" / f"file-{n:05d}.bin").write_bytes(rng.randbytes(rng.randrange(1 << 10, 20 << 10)))
        tmp.rename(folder)
    return folder


def land(source: Path, work: Path, checkout: Path | None) -> Measurement:
    shutil.rmtree(work / "lake", ignore_errors=True)
    return ours_target_at({"lake_root": str(work / "lake")}, source, work, checkout)


def push(files: Path, work: Path, checkout: Path | None) -> Measurement:
    shutil.rmtree(work / "lake", ignore_errors=True)
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(checkout / package) for package in ("shared", "tap-singerlake", "target-singerlake"))
    command = [sys.executable, "-c", "from singerlake.cli.main import main; main()", "push", str(work / "lake"), str(files)]
    result = measure([*command, "--what", "bench", "--where", "here", "--json"], None, env=env)
    if result.returncode != 0:
        raise SystemExit(f"push ({checkout or 'this checkout'}) failed with exit code {result.returncode}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="a checkout without the durability fsyncs")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    before = args.before.resolve()
    cases = {
        f"landing users × {args.records:,}": (land, singer_file(args.records)),
        f"push {args.files:,} small files": (push, small_files(args.files)),
    }
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory(prefix="durability-", dir=OUT) as tmp:
        work = Path(tmp)
        for round_ in range(args.repeat):
            for name, (job, source) in cases.items():
                if round_ % 2 == 0:
                    after = job(source, work, None).wall_s
                    prior = job(source, work, before).wall_s
                else:
                    prior = job(source, work, before).wall_s
                    after = job(source, work, None).wall_s
                rounds[name].append((after, prior))
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; load average at the end {load}")
    print(f"best of {args.repeat} (min–max); before: {before.name}\n")
    print("| case | with the fsyncs, s | before, s | ratio of the bests | ratio per round (min–max) | goal | met |")
    print("|---|---:|---:|---:|---:|---|---|")
    for name, pairs in rounds.items():
        afters, priors = [a for a, _ in pairs], [b for _, b in pairs]
        ratio, per_round = min(afters) / min(priors), sorted(a / b for a, b in pairs)
        met = "yes" if ratio <= GOAL else "no"
        rounds_text = f"{per_round[0]:.3f}–{per_round[-1]:.3f}"
        print(f"| {name} | {spread(afters, 2)} | {spread(priors, 2)} | {ratio:.3f} | {rounds_text} | ≤ {GOAL} | {met} |")


if __name__ == "__main__":
    with published("durability"):
        main()
