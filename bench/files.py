"""Files in the lake (issue #22, SPEC.md §14): push, query and fetch against plain loops in the same run.

    python bench/files.py [--small-files 10000] [--days 365] [--big-mib 1024] [--repeat 3] [--quick]

- small: push --small-files files of 1-20 KiB (random bytes) with ``Lake.push`` in-process, beside a
  plain ``shutil.copyfile`` loop into a directory (local) and a plain sequential boto3 ``put_object``
  loop into the same server (moto S3 on 127.0.0.1); the CLI push of the same files too. A fresh lake
  (a fresh prefix on S3) per run. Ratio: push / plain loop (goal <= 1.5).
- query: an index of --days days × 1,000 files built directly with ``files.index.commit`` (one
  commit per day, 50 wheres, times over the day, some spanning midnight, 20 work ids a day), and one
  of 10 days beside it (another what of the same lake): one day by time (with and without a where),
  a work id, latest. Time (best of max(--repeat, 5)) and storage requests: calls through a counting
  wrapper, and on S3 the HTTP requests too (goals: < 0.5 s, <= 10 requests, the same for 10 and for
  --days days). Then one file spanning 40 days pushed into the big what: its segment is read by every
  time query (SPEC §14 ``long/``): the requests of a day's query after it.
- big: a --big-mib MiB file pushed and fetched with the CLI, each in a fresh subprocess: MB/s and
  the peak RSS of the process (wait4), beside ``cp`` (goals: >= 100 MB/s, <= 200 MiB); then its push
  to moto S3 (multipart), beside boto3's ``upload_file`` in a subprocess; a 200 MiB file instead when
  the big one takes over 2 minutes there.

Prints a markdown table: best, spread (min-max of the repeats), the peer's figure and the ratio of the
bests, the goal; for the small files also the ratio within each round (ours and the plain loop run
one after the other), steadier than the bests when the machine's load changes between rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from published import published
from singerlake.files import index
from singerlake.files.record import make_record
from singerlake.lake import Lake
from singerlake.storage import LocalStorage, S3Storage, Storage
from streams import moto_s3  # first: it puts tests/ on sys.path, for support (the tests' S3 server launcher and counting storage)
from support.storage import Counting

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
BIN = Path(sys.executable).parent
CLI = str(BIN / "singerlake")
DAY_MS = 86_400_000
DAY0 = 1_735_689_600_000  # 2025-01-01T00:00:00Z
KEYS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_DEFAULT_REGION": "us-east-1"}
MOTO_BIG_LIMIT_S = 120
MOTO_FALLBACK_MIB = 200


@dataclass
class Row:
    section: str
    what: str
    best: float
    spread: str
    unit: str
    peer: str = ""  # the peer's figure
    ratio: str = ""
    goal: str = ""
    met: str = ""


def best_of(runs: list[float], fmt: str = "{:.2f}") -> tuple[float, str]:
    return min(runs), (f"{fmt.format(min(runs))}–{fmt.format(max(runs))}" if len(runs) > 1 else "")


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


# A small Python between us and the command: a child's ru_maxrss starts at its parent's RSS at the
# fork (this bench's own ~80 MiB), so the command is forked from this ~10 MiB one instead.
RSS_HELPER = (
    "import json, os, subprocess, sys; proc = subprocess.Popen(sys.argv[2:]); _, status, usage = os.wait4(proc.pid, 0); "
    "open(sys.argv[1], 'w').write(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss]))"
)


def run_wait4(
    cmd: list[str], env: dict | None = None, stdout=subprocess.DEVNULL, timeout: float | None = None
) -> tuple[float, float] | None:
    """Wall seconds and the command's own peak RSS in MiB (wait4's ru_maxrss), failing loudly on a non-zero
    exit; None when it ran over ``timeout`` seconds (then it is killed)."""
    with tempfile.NamedTemporaryFile("r", suffix=".json") as report, tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        helper = subprocess.Popen(
            [sys.executable, "-c", RSS_HELPER, report.name, *cmd], env=env, stdout=stdout, stderr=stderr, start_new_session=True
        )
        try:
            helper.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(helper.pid, signal.SIGKILL)
            helper.wait()
            return None
        wall = time.perf_counter() - started
        code, maxrss_kib = json.loads(report.read() or "[-1, 0]")
        if code != 0:
            stderr.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed ({code}):\n{stderr.read().decode(errors='replace')[-3000:]}")
    return wall, maxrss_kib / 1024


def env_for_cli() -> dict:
    paths = [str(HERE.parent / p) for p in ("shared", "tap-singerlake", "target-singerlake")]
    return {**os.environ, **KEYS, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}


# -- moto ------------------------------------------------------------------------------------------
@dataclass
class Moto:
    endpoint: str
    bucket: str

    def client(self):
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id="bench", aws_secret_access_key="bench-secret", region_name="us-east-1"
        )

    def storage(self, prefix: str) -> S3Storage:
        return S3Storage(
            f"s3://{self.bucket}/{prefix}",
            endpoint_url=self.endpoint,
            access_key_id="bench",
            secret_access_key="bench-secret",
            region="us-east-1",
        )


@contextlib.contextmanager
def moto_server() -> Iterator[Moto]:
    """bench/streams.py's moto server (the tests' launcher) on 127.0.0.1 and its fresh bucket."""
    with moto_s3() as settings:
        yield Moto(settings["s3_endpoint_url"], settings["lake_root"].removeprefix("s3://").split("/")[0])


# -- counting requests (the counting storage is the tests': tests/support/storage.py) -----------------
class HttpCount:
    """HTTP requests an S3 storage's (shared) boto3 client sends."""

    def __init__(self, storage: S3Storage):
        self.n = 0
        storage.client.meta.events.register("before-send.s3", self._seen)

    def _seen(self, **kwargs) -> None:
        self.n += 1


# -- small files -----------------------------------------------------------------------------------
def small_files(work: Path, count: int) -> Path:
    source = work / "small"
    source.mkdir()
    rng = random.Random(22)
    for n in range(count):
        (source / f"f{n:05d}.bin").write_bytes(rng.randbytes(rng.randint(1 << 10, 20 << 10)))
    return source


def small(work: Path, moto: Moto, args: argparse.Namespace, s3: bool = True) -> list[Row]:
    source = small_files(work, args.small_files)
    n, total = args.small_files, sum(p.stat().st_size for p in source.iterdir())
    label = f"push {n:,} files of 1–20 KiB ({total / 2**20:.0f} MiB)"
    runs: dict[str, list[float]] = {k: [] for k in ("copy", "push", "cli", "put", "s3push")}
    client = moto.client()
    env = env_for_cli()
    for i in range(args.repeat):
        dest = work / f"copy-{i}"

        def plain_copy(dest: Path = dest) -> None:
            dest.mkdir()
            for name in sorted(os.listdir(source)):
                shutil.copyfile(source / name, dest / name)

        runs["copy"].append(timed(plain_copy))
        lake = Lake(LocalStorage(work / f"lake-{i}"))
        runs["push"].append(timed(lambda lake=lake: check_pushed(lake.push([source], what="bench", where="host-1"), n)))
        runs["cli"].append(
            run_wait4([CLI, "push", str(work / f"cli-{i}"), str(source), "--what", "bench", "--where", "host-1", "--json"], env)[0]
        )

        def plain_put(i: int = i) -> None:
            for name in sorted(os.listdir(source)):
                client.put_object(Bucket=moto.bucket, Key=f"plain-{i}/{name}", Body=(source / name).read_bytes())

        if s3:
            runs["put"].append(timed(plain_put))
            s3lake = Lake(moto.storage(f"lake-{i}"))
            runs["s3push"].append(timed(lambda s3lake=s3lake: check_pushed(s3lake.push([source], what="bench", where="host-1"), n)))
        for path in (dest, work / f"lake-{i}", work / f"cli-{i}"):
            shutil.rmtree(path)
        print(f"  small files, run {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in runs.items() if v), file=sys.stderr)
    rows = []
    cases = [("local", "copy", "shutil.copyfile loop", "push", "Lake.push (in-process)")]
    cases += [("local", "copy", "shutil.copyfile loop", "cli", "singerlake push (CLI, new process)")]
    cases += [("moto S3", "put", "put_object loop", "s3push", "Lake.push (in-process)")] if s3 else []
    for place, plain, plain_name, key, what in cases:
        peer, _ = best_of(runs[plain])
        b, spread = best_of(runs[key])
        goal, met = ("≤ 1.5× the plain loop", "yes" if b / peer <= 1.5 else "no") if key != "cli" else ("", "")
        _, peer_spread = best_of(runs[plain])
        what = f"{what}; peer: {plain_name} {peer:.2f} s ({peer_spread or 'one run'})"
        rounds = [ours / theirs for ours, theirs in zip(runs[key], runs[plain], strict=True)]
        ratio = f"{b / peer:.2f}" + (f" (each round: {', '.join(f'{r:.2f}' for r in rounds)})" if len(rounds) > 1 else "")
        rows.append(Row(f"{label}, {place}", what, b, spread, "s", f"{peer:.2f}", ratio, goal, met))
    return rows


def check_pushed(result, n: int) -> None:
    if len(result.pushed) != n:
        raise SystemExit(f"pushed {len(result.pushed)} files, expected {n}")


# -- queries ---------------------------------------------------------------------------------------
WHERES = [f"host-{k:02d}" for k in range(50)]
WORK_IDS_PER_DAY = 20


def day_records(what: str, day: int, count: int, txn: str, rng: random.Random) -> list[dict]:
    """A day's files: 30% instants, 60% of 1-60 minutes, 10% of 1-6 hours (those late in the day span midnight)."""
    records = []
    for n in range(count):
        start = DAY0 + day * DAY_MS + rng.randrange(DAY_MS)
        kind = rng.random()
        end = (
            None if kind < 0.3 else start + rng.randint(60_000, 3_600_000) if kind < 0.9 else start + rng.randint(3_600_000, 6 * 3_600_000)
        )
        where = rng.choice(WHERES)
        work_id = None if rng.random() < 0.2 else f"job-{day:03d}-{rng.randrange(WORK_IDS_PER_DAY):02d}"
        records.append(
            make_record(
                what=what, where=where, work_id=work_id, start=start, end=end, path=f"/var/log/{where}/{day}-{n}.log",
                name=f"{day}-{n}.log", content_hash=f"{rng.getrandbits(128):032x}", size=rng.randint(1 << 10, 20 << 10), txn=txn,
            )
        )  # fmt: skip
    return records


def build_index(storage: Storage, what: str, days: int, per_day: int) -> float:
    rng = random.Random(f"{what}-{days}")
    started = time.perf_counter()
    for day in range(days):
        txn = uuid.UUID(int=rng.getrandbits(128)).hex  # any unique name: a UUIDv7's order is not needed here
        index.commit(storage, what, txn, day_records(what, day, per_day, txn, rng))
    return time.perf_counter() - started


def queries(storage: Storage, what: str, days: int) -> dict[str, Callable[[Lake], object]]:
    day = days // 2
    first = DAY0 + day * DAY_MS
    work_id = f"job-{day:03d}-07"
    return {
        "one day": lambda lake: lake.find_files(what, start=first, end=first + DAY_MS - 1),
        "one day, one where": lambda lake: lake.find_files(what, where="host-07", start=first, end=first + DAY_MS - 1),
        "work id": lambda lake: lake.find_files(what, work_id=work_id),
        "latest": lambda lake: lake.latest_file(what),
        "latest of a where": lambda lake: lake.latest_file(what, "host-07"),
    }


def measure_query(storage: Storage, query: Callable[[Lake], object], repeat: int) -> tuple[list[float], int, int | None, int]:
    """Times of ``repeat`` runs, then the calls (and HTTP requests on S3) of one more, and its result's size."""
    lake = Lake(storage)
    times = [timed(lambda: query(lake)) for _ in range(repeat)]
    counting = Counting(storage)
    http = HttpCount(storage) if isinstance(storage, S3Storage) else None
    found = query(Lake(counting))
    size = len(found) if isinstance(found, list) else int(found is not None)
    return times, len(counting.requests), (http.n if http else None), size


def query_rows(work: Path, moto: Moto, args: argparse.Namespace) -> list[Row]:
    rows = []
    repeat = max(args.repeat, 5)
    for place, storage in (("local", LocalStorage(work / "index-lake")), ("moto S3", moto.storage("index-lake"))):
        built = {days: build_index(storage, f"days{days}", days, 1000) for days in (10, args.days)}
        print(f"  {place}: index built in " + ", ".join(f"{d} days {s:.0f} s" for d, s in built.items()), file=sys.stderr)
        measured = {
            days: {name: measure_query(storage, q, repeat) for name, q in queries(storage, f"days{days}", days).items()} for days in built
        }
        for name in measured[10]:
            small_calls = measured[10][name][1]
            for days in built:
                times, calls, http, size = measured[days][name]
                b, spread = best_of(times, "{:.3f}")
                requests = f"{calls} calls" + (f", {http} HTTP" if http is not None else "")
                goal = "< 0.5 s, ≤ 10 requests, same at 10 days" if name.startswith("one day") else ""
                top = max(calls, http or 0)
                met = ("yes" if b < 0.5 and top <= 10 and calls == small_calls else "no") if goal else ""
                what = f"{name} ({size:,} found); {requests}"
                rows.append(Row(f"query, {place}, {days} days × 1,000 files", what, b, spread, "s", goal=goal, met=met))
        rows.append(long_span(storage, place, args, repeat))
    return rows


def long_span(storage: Storage, place: str, args: argparse.Namespace, repeat: int) -> Row:
    """A file of 40 days in the big what (``long/``): what a one-day query costs after it."""
    what = f"days{args.days}"
    txn = uuid.uuid4().hex
    start = DAY0 + 3 * DAY_MS
    record = make_record(
        what=what, where="host-99", work_id=None, start=start, end=start + 40 * DAY_MS, path="/var/log/long.log",
        name="long.log", content_hash=uuid.uuid4().hex, size=1, txn=txn,
    )  # fmt: skip
    index.commit(storage, what, txn, [record])
    times, calls, http, size = measure_query(storage, queries(storage, what, args.days)["one day"], repeat)
    b, spread = best_of(times, "{:.3f}")
    requests = f"{calls} calls" + (f", {http} HTTP" if http is not None else "")
    return Row(f"query, {place}, {args.days} days + 1 file of 40 days (long/)", f"one day ({size:,} found); {requests}", b, spread, "s")


# -- one big file ----------------------------------------------------------------------------------
def big_file(work: Path, mib: int, name: str = "big.bin") -> Path:
    path = work / name
    with open(path, "wb") as out:
        for _ in range(mib):
            out.write(os.urandom(1 << 20))
    return path


def pushed_id(cmd: list[str], env: dict) -> tuple[float, float, str]:
    out = tempfile.TemporaryFile()
    wall, rss = run_wait4(cmd, env, stdout=out)
    out.seek(0)
    result = json.load(out)
    return wall, rss, (result["pushed"] or result["duplicates"])[0]["id"]


def big(work: Path, moto: Moto, args: argparse.Namespace) -> list[Row]:
    env = env_for_cli()
    path = big_file(work, args.big_mib)
    mb = path.stat().st_size / 1e6
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in ("cp", "push", "fetch", "cp-back")}
    for i in range(args.repeat):
        lake = work / f"big-lake-{i}"
        runs["cp"].append(run_wait4(["cp", str(path), str(work / "copy.bin")]))
        wall, rss, file_id = pushed_id([CLI, "push", str(lake), str(path), "--what", "big", "--where", "host-1", "--json"], env)
        runs["push"].append((wall, rss))
        runs["fetch"].append(run_wait4([CLI, "fetch", str(lake), file_id, "--out", str(work / "fetched.bin"), "--json"], env))
        stored = next((lake / "files" / "data").rglob(file_id))
        runs["cp-back"].append(run_wait4(["cp", str(stored), str(work / "copied-back.bin")]))
        if (work / "fetched.bin").stat().st_size != path.stat().st_size:
            raise SystemExit("the fetched file is not the pushed one")
        for p in (work / "copy.bin", work / "fetched.bin", work / "copied-back.bin"):
            p.unlink()
        shutil.rmtree(lake)
        print(
            f"  big file, run {i + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f} s {v[-1][1]:.0f} MiB" for k, v in runs.items()), file=sys.stderr
        )
    rows = []
    label = f"{args.big_mib:,} MiB file, local lake"
    for key, peer_key, what in (("push", "cp", "singerlake push (CLI)"), ("fetch", "cp-back", "singerlake fetch (CLI)")):
        walls = [w for w, _ in runs[key]]
        peer = min(w for w, _ in runs[peer_key])
        b, spread = mb / min(walls), f"{mb / max(walls):.0f}–{mb / min(walls):.0f}" if len(walls) > 1 else ""
        rss = max(r for _, r in runs[key])
        rows.append(
            Row(
                label,
                f"{what}; peer: cp {mb / peer:.0f} MB/s",
                b,
                spread,
                "MB/s",
                f"{mb / peer:.0f}",
                f"{b / (mb / peer):.2f}",
                "≥ 100 MB/s",
                "yes" if b >= 100 else "no",
            )
        )
        rows.append(Row(label, f"{what}: peak RSS (max of runs)", rss, "", "MiB", goal="≤ 200 MiB", met="yes" if rss <= 200 else "no"))
    rows += big_on_moto(work, moto, path, args, env)
    path.unlink()
    return rows


def big_on_moto(work: Path, moto: Moto, path: Path, args: argparse.Namespace, env: dict) -> list[Row]:
    """The big file's push to moto (multipart); 200 MiB instead when it takes over 2 minutes."""

    def push(source: Path, i: int, timeout: float | None = None) -> tuple[float, float] | None:
        cmd = [CLI, "push", f"s3://{moto.bucket}/big-{source.name}-{i}", str(source), "--what", "big", "--where", "host-1", "--json"]
        return run_wait4([*cmd, "--s3-endpoint-url", moto.endpoint], env, timeout=timeout)

    source = path
    first = push(source, 0, MOTO_BIG_LIMIT_S)
    if first is None:
        print(f"  moto: {path.stat().st_size >> 20} MiB took over {MOTO_BIG_LIMIT_S} s: {MOTO_FALLBACK_MIB} MiB instead", file=sys.stderr)
        source = big_file(work, MOTO_FALLBACK_MIB, "moto.bin")
    mb = source.stat().st_size / 1e6
    ours = [first] if first is not None else [push(source, 1)]  # one run: a GiB through moto takes a while
    script = "import boto3, sys; boto3.client('s3', endpoint_url=sys.argv[1]).upload_file(sys.argv[2], sys.argv[3], sys.argv[4])"
    peer = [
        run_wait4([sys.executable, "-c", script, moto.endpoint, str(source), moto.bucket, f"plain-{source.name}-{i}"], env)
        for i in range(1)
    ]
    b, spread = mb / min(w for w, _ in ours), ""
    peer_rate = mb / min(w for w, _ in peer)
    rss = max(r for _, r in ours)
    label = f"{source.stat().st_size >> 20:,} MiB file, moto S3 (multipart)"
    what = f"singerlake push (CLI), peak RSS {rss:.0f} MiB; peer: boto3 upload_file {peer_rate:.0f} MB/s, {max(r for _, r in peer):.0f} MiB"
    return [Row(label, what, b, spread, "MB/s", f"{peer_rate:.0f}", f"{b / peer_rate:.2f}")]


# -- main ------------------------------------------------------------------------------------------
def print_table(rows: list[Row], args: argparse.Namespace, started: float, load_before: tuple) -> None:
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    load = " → ".join(" ".join(f"{x:.1f}" for x in loads) for loads in (load_before, os.getloadavg()))
    print(f"machine: {machine}; load average (1, 5, 15 min) at start → end: {load}")
    shape = f"--small-files {args.small_files} --days {args.days} --big-mib {args.big_mib} --repeat {args.repeat}"
    print(f"bench/files.py {shape}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {time.time() - started:.0f} s")
    print("| shape | measured | best | min–max | unit | peer | ours / peer | goal | met |")
    print("|---|---|---:|---:|---|---:|---:|---|---|")
    for r in rows:
        value = f"{r.best:.3f}" if r.unit == "s" and r.best < 1 else f"{r.best:.2f}" if r.unit == "s" else f"{r.best:.0f}"
        print(f"| {r.section} | {r.what} | {value} | {r.spread} | {r.unit} | {r.peer} | {r.ratio} | {r.goal} | {r.met} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small-files", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=365, help="days of the big index (the small one has 10)")
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--parts", default="small,query,big", help="comma-separated, of small (small-local: without moto), query, big (default all)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 300 files, 12 days, 32 MiB, once")
    args = parser.parse_args()
    if args.quick:
        args.small_files, args.days, args.big_mib, args.repeat = 300, 12, 32, 1
    parts = set(args.parts.split(","))
    started, load_before = time.time(), os.getloadavg()
    OUT.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(dir=OUT) as tmp, moto_server() as moto:
        work = Path(tmp)
        if parts & {"small", "small-local"}:
            rows += small(work, moto, args, s3="small" in parts)
        if "query" in parts:
            rows += query_rows(work, moto, args)
        if "big" in parts:
            rows += big(work, moto, args)
    print_table(rows, args, started, load_before)


if __name__ == "__main__":
    with published("files"):
        main()
