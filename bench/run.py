"""Benchmarks of target-singerlake and tap-singerlake beside their PyPI peers, measured in the same run.

Each peer runs from its own venv under bench/out/venvs (created on first use). Prints one table:
wall time, peak RSS of the whole process tree (Python + JVM + Spark workers) and the ratios to our
plugin in the same shape. Shapes (--shapes, default all, in this order):

- 1m: each target lands the `users` stream of bench/gen_users.py (--records) from stdin (ours into
  a fresh local lake); --scale-records adds our target alone on a bigger file;
- 300x200, 1000x20, 10: the same for the output of a database tap (bench/gen_streams.py): 300
  streams of 200 records, 1,000 of 20, one stream of 10;
- baseline: starting Spark as the project does plus one Python task, in a new process (what the
  10-record row cannot go below);
- s3: our target on 300x200 into a lake on S3 (moto over HTTP on 127.0.0.1), ratio to the local lake's
  300x200 row (landed here first, untimed, when 300x200 did not run);
- second: 5 new records in each of the 300 streams, onto the lake (peers: the folder) left by 300x200;
- jobs: `singerlake verify`, `compact`, `project` (Spark local[*]) on the lake left by `second`;
- tap: each tap replays the --records users to /dev/null: ours from a lake landed by our target
  (landed once, not timed), tap-singer-jsonl from the Singer file, tap-jsonl from the records as
  plain JSONL.

A shape whose predecessor was not selected lands it first, untimed. --repeat N runs our plugin
(and the baseline and jobs) N times: the best wall time is reported, with the spread. --against DIR
adds to the 1m shape the target of another checkout of this repository (its packages on PYTHONPATH,
this venv's libraries), run alternately with ours, --repeat times each, so both see the same machine.

Usage: python bench/run.py [--shapes 1m,300x200,1000x20,10,baseline,s3,second,jobs,tap] [--only target|tap]
                           [--records 1000000] [--scale-records 5000000] [--no-peers] [--repeat 1] [--against DIR]
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
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import streams
from measure import Measurement, measure
from published import published

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
def ours_target(source: Path, work: Path, lake: Path | None = None, fresh: bool = True) -> Measurement:
    """Land ``source`` into ``lake`` (default work/lake): a new lake, or with fresh=False the one there."""
    lake = lake or work / "lake"
    if fresh:
        shutil.rmtree(lake, ignore_errors=True)
    return ours_target_at({"lake_root": str(lake)}, source, work)


def ours_target_at(settings: dict, source: Path, work: Path, checkout: Path | None = None) -> Measurement:
    if checkout is None:
        return run("target-singerlake", BIN / "target-singerlake", "--config", {**settings, "tap_id": "tap-bench"}, work, source)
    config = work / "target-against.json"
    config.write_text(json.dumps({**settings, "tap_id": "tap-bench"}))
    packages = [checkout / "shared", checkout / "tap-singerlake", checkout / "target-singerlake"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, packages))}
    cli = "from target_singerlake.target import TargetSingerlake; TargetSingerlake.cli()"
    result = measure([sys.executable, "-c", cli, "--config", str(config)], str(source), env=env)
    if result.returncode != 0:
        raise SystemExit(f"target-singerlake of {checkout} failed with exit code {result.returncode}")
    return result


def against_target(checkout: Path, source: Path, work: Path) -> Measurement:
    shutil.rmtree(work / "lake", ignore_errors=True)
    return ours_target_at({"lake_root": str(work / "lake")}, source, work, checkout)


def interleaved(ours, theirs, repeat: int) -> tuple[list[Measurement], list[Measurement]]:
    """Ours and theirs alternately, ``repeat`` runs each: a machine's slow minute falls on both."""
    pairs = [(ours(), theirs()) for _ in range(repeat)]
    return [a for a, _ in pairs], [b for _, b in pairs]


def peer_target(name: str, source: Path, work: Path, fresh: bool = True) -> Measurement:
    """Land ``source`` into the folder work/<name>: a new one, or with fresh=False the one there."""
    folder = work / name
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(exist_ok=True)
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


# -- shapes ----------------------------------------------------------------------------------------
SHAPE_KEYS = ["1m", *streams.SHAPES, "baseline", "s3", "second", "jobs", "tap"]


@dataclass
class Row:
    shape: str
    plugin: str
    records: int | None  # None: no records/s
    m: Measurement
    ours: Measurement | None  # what the ratios are to
    spread: str = ""


def best(runs: list[Measurement]) -> tuple[Measurement, str]:
    """The run of least wall time, and the spread of wall times when there were several."""
    walls = [m.wall_s for m in runs]
    return min(runs, key=lambda m: m.wall_s), f"{min(walls):.1f}–{max(walls):.1f}" if len(runs) > 1 else ""


def compare(shape: str, count: int, plugin: str, ours, peers: dict, args: argparse.Namespace) -> list[Row]:
    """Our plugin (``ours()``) best of --repeat, then each peer once; ratios to our best."""
    mine, spread = best([ours() for _ in range(args.repeat)])
    rows = [Row(shape, plugin, count, mine, mine, spread)]
    return rows + [Row(shape, name, count, peer(), mine) for name, peer in ({} if args.no_peers else peers).items()]


def targets(source: Path, work: Path, fresh: bool = True) -> dict:
    """The peer targets landing ``source`` into their folders under ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    return {name: partial(peer_target, name, source, work, fresh=fresh) for name in TARGET_PEERS}


def second_and_jobs(shapes: set[str], work: Path, args: argparse.Namespace) -> list[Row]:
    """The second run onto the 300-stream lake and folders (landed untimed when 300x200 did not run), then the lake jobs."""
    first, second, many = work / streams.MANY.key, work / streams.SECOND.key, streams.singer_file(streams.MANY)
    first.mkdir(exist_ok=True)
    if not (first / "lake").exists():
        ours_target(many, first)
    for name, land in ({} if args.no_peers else targets(many, first)).items():
        if not (first / name).exists():
            land()
    source = streams.singer_file(streams.SECOND)
    second.mkdir(exist_ok=True)

    def ours() -> Measurement:
        return ours_target(source, second, streams.fresh_copy(first / "lake", second / "lake"), fresh=False)

    shape, rows = streams.SECOND, []
    if "second" in shapes:
        rows = compare(shape.label, shape.total, "target-singerlake", ours, targets(source, first, fresh=False), args)
    else:
        ours()  # untimed: the jobs run on the lake after the second run
    if "jobs" in shapes:
        label = f"lake jobs, {streams.MANY.streams} streams × {streams.MANY.records + shape.records}"
        runs = [streams.lake_jobs(second / "lake", work) for _ in range(args.repeat)]
        for job, measured in zip(streams.JOBS, zip(*runs, strict=True), strict=True):
            m, spread = best(list(measured))
            rows.append(Row(label, f"singerlake {job}", None, m, None, spread))
    return rows


def s3_shape(rows: list[Row], work: Path, args: argparse.Namespace) -> list[Row]:
    """300x200 into a fresh lake on moto S3 per run, against the local lake's row of this run."""
    source, label = streams.singer_file(streams.MANY), streams.MANY.label
    local = [row.m for row in rows if row.shape == label and row.plugin == "target-singerlake"]
    ours = local[0] if local else best([ours_target(source, work, lake=work / "s3-local") for _ in range(args.repeat)])[0]

    def on_s3() -> Measurement:
        with streams.moto_s3() as settings:
            return ours_target_at(settings, source, work)

    m, spread = best([on_s3() for _ in range(args.repeat)])
    return [Row(f"{label}, lake on S3 (moto; ratios to the local lake)", "target-singerlake", streams.MANY.total, m, ours, spread)]


def shapes_arg(text: str) -> list[str]:
    chosen = [key.strip() for key in text.split(",") if key.strip()]
    unknown = sorted(set(chosen) - set(SHAPE_KEYS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown shape(s) {', '.join(unknown)}; choose from {','.join(SHAPE_KEYS)}")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", type=shapes_arg, default=SHAPE_KEYS, help=f"comma-separated, of {','.join(SHAPE_KEYS)} (default all)")
    parser.add_argument("--only", choices=["target", "tap"], help="target: all shapes but tap; tap: only tap")
    parser.add_argument("--records", type=int, default=1_000_000, help="records of the users stream (shapes 1m and tap)")
    parser.add_argument("--scale-records", type=int, default=0, help="also run our plugins alone on this many records")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="runs of our plugins; the best wall time is reported, with the spread")
    parser.add_argument(
        "--against", type=Path, help="a checkout of this repository whose target the 1m shape also runs, alternately with ours"
    )
    args = parser.parse_args()
    shapes = {key for key in args.shapes if args.only is None or (key == "tap") == (args.only == "tap")}
    n, scale = args.records, args.scale_records
    rows: list[Row] = []
    inputs: dict[str, Path] = {}
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        work = Path(tmp)
        if "1m" in shapes:
            source = inputs[f"users {n:,}"] = singer_file(n)
            if args.against:
                label, checkout = f"users × {n:,}", args.against.resolve()
                mine, theirs = interleaved(partial(ours_target, source, work), partial(against_target, checkout, source, work), args.repeat)
                (m, spread), (t, t_spread) = best(mine), best(theirs)
                rows += [
                    Row(label, "target-singerlake", n, m, m, spread),
                    Row(label, f"target-singerlake of {checkout.name}", n, t, m, t_spread),
                ]
                rows += [Row(label, name, n, peer(), m) for name, peer in ({} if args.no_peers else targets(source, work)).items()]
            else:
                rows += compare(f"users × {n:,}", n, "target-singerlake", partial(ours_target, source, work), targets(source, work), args)
            if scale:
                rows.append(Row(f"users × {scale:,}", "target-singerlake", scale, ours_target(singer_file(scale), work), ours_of(rows)))
        for key, shape in streams.SHAPES.items():
            if key in shapes:
                source = inputs[shape.label] = streams.singer_file(shape)
                ours = partial(ours_target, source, work / key)
                rows += compare(shape.label, shape.total, "target-singerlake", ours, targets(source, work / key), args)
        if "baseline" in shapes:
            m, spread = best([streams.baseline(work) for _ in range(args.repeat)])
            ten = [row.m for row in rows if row.shape == streams.SHAPES["10"].label and row.plugin == "target-singerlake"]
            rows.append(Row("baseline (ratios to the 10-record row)", streams.BASELINE_LABEL, None, m, ten[0] if ten else None, spread))
        if "s3" in shapes:
            rows += s3_shape(rows, work, args)
        if shapes & {"second", "jobs"}:
            inputs[streams.SECOND.label] = streams.singer_file(streams.SECOND)
            rows += second_and_jobs(shapes, work, args)
        if "tap" in shapes:
            landed_lake(n)
            peers = {name: partial(peer_tap, name, n, work) for name in TAP_PEERS}
            rows += compare(f"users × {n:,}, tap", n, "tap-singerlake", partial(ours_tap, n, work), peers, args)
            if scale:
                landed_lake(scale)
                rows.append(Row(f"users × {scale:,}, tap", "tap-singerlake", scale, ours_tap(scale, work), ours_of(rows)))
    print_table(rows, inputs)


def ours_of(rows: list[Row]) -> Measurement:
    """What the ratios of the last shape's rows are to."""
    return rows[-1].ours


def print_table(rows: list[Row], inputs: dict[str, Path]) -> None:
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("inputs: " + "; ".join(f"{label}: {path.stat().st_size / 2**10:,.0f} KiB" for label, path in inputs.items()))
    print("| shape | plugin | records | wall s | min–max s | peak RSS MiB | records/s | wall / ours | RSS / ours |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        records, rate = (f"{r.records:,}", f"{r.records / r.m.wall_s:,.0f}") if r.records else ("", "")
        ratios = f"{r.m.wall_s / r.ours.wall_s:.2f} | {r.m.peak_rss_mb / r.ours.peak_rss_mb:.2f}" if r.ours else " | "
        print(f"| {r.shape} | {r.plugin} | {records} | {r.m.wall_s:.1f} | {r.spread} | {r.m.peak_rss_mb:.0f} | {rate} | {ratios} |")


if __name__ == "__main__":
    with published("run"):
        main()
