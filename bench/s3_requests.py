"""S3 requests per operation, counted at the HTTP level, beside Delta's floor for the same work.

    python bench/s3_requests.py [--records 100] [--batches 3] [--streams 50] [--rounds 100] [--updates 10] [--json] [--verbose]

A moto S3 server (tests/support/s3_servers.py) behind the tests' counting proxy (tests/support/s3_counter.py),
which sees every request of every process (the CLIs, their Spark executors' Python workers, delta-rs); each
operation is the real command the documentation describes, in a process of its own, pointed at the proxy:

- land 1 stream (target-singerlake, --records records): cold (the lake's first run), warm (a new run of the
  stream), and each further batch of a run (a run of --batches batches of --records, minus one of a batch fewer;
  extra batch); land --streams streams, cold and warm;
- replay 1 stream (tap-singerlake); project (`singerlake project`): first run, and incremental after a
  landing of --updates updated keys; the same for the --streams streams (after their warm run);
- push of a small file, `files --what` (one day), `files --latest`, `fetch` of that file;
- the long run: --rounds rounds of land-then-project on one stream (round 1 landed by the target, later
  rounds by the core's SchemaWriter in this process, --updates new records each), each project the real
  CLI (in a process of its own at rounds 1, 2, 10, 100 and --rounds, whose requests and wall time are
  shown; the others in one CLI session, to save an interpreter start each); a round whose project wrote a
  Delta checkpoint says so;
- the monthly cost of a pipeline landing --streams streams every 5 minutes and projecting after each run
  (8,640 runs): the warm landing of the streams + their incremental project + the growth per stream of the
  long run's project from round 2 to its last rounds (the mean of one checkpoint interval), at S3
  Standard list prices (printed).

Kinds as S3 bills them (HEAD at the GET price; POST: CreateMultipartUpload/CompleteMultipartUpload;
DELETE includes batch deletes). Delta's floor: what a Delta writer or reader that knows its table's version
must send for the same work (the notes under the table say which); none for the files queries. --verbose
adds each operation's requests, and their count by part of the lake. The defaults take 6-10 minutes on a
shared 2-core machine (the long run about half); the long run grows with --rounds (1,000 works).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import streams  # noqa: F401  (first: it puts tests/ on sys.path, for support: the tests' S3 launcher and counting proxy)
from published import published
from singerlake.tables.delta_log import CHECKPOINT_INTERVAL
from support.cli_session import CliSession
from support.s3_counter import KINDS, S3Counter
from support.s3_servers import start_moto

BIN = Path(sys.executable).parent
TAP = "tap-bench"
KEYS = {"access_key_id": "bench", "secret_access_key": "bench-secret", "region": "us-east-1"}
PRICE_PER_1000 = {"PUT": 0.005, "POST": 0.005, "LIST": 0.005, "GET": 0.0004, "HEAD": 0.0004, "DELETE": 0.0}
PRICES = (
    "S3 Standard list prices (us-east-1) as of 2026-11-28: PUT, COPY, POST, LIST $0.005 per 1,000; "
    "GET, HEAD and others $0.0004 per 1,000; DELETE free"
)
RUNS_PER_MONTH = 30 * 24 * 12  # every 5 minutes: 8,640
SHOWN_ROUNDS = (1, 2, 10, 100)
DAY, NEXT_DAY = "2026-11-27", "2026-11-28"


@dataclass
class Row:
    operation: str
    kinds: Counter
    bytes_in: float
    bytes_out: float
    wall_s: float
    floor: Counter | None = None  # Delta's (or a plain copy's) floor
    floor_is: str = ""
    requests: list[str] = field(default_factory=list)

    @property
    def put_keys(self) -> list[str]:
        return [line.split(" ")[1] for line in self.requests if line.startswith("PutObject ")]

    def to_dict(self) -> dict:
        return {
            "operation": self.operation,
            "requests": {kind: self.kinds.get(kind, 0) for kind in KINDS},
            "total": sum(self.kinds.values()),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "wall_s": round(self.wall_s, 2),
            "floor": dict(self.floor) if self.floor is not None else None,
            "floor_is": self.floor_is,
        }


def per(counter: Counter, by: float) -> Counter:
    return Counter({kind: n / by for kind, n in counter.items()})


def minus(a: Counter, b: Counter) -> Counter:
    return Counter({kind: a.get(kind, 0) - b.get(kind, 0) for kind in set(a) | set(b)})


def cost(kinds: Counter) -> float:
    return sum(n * PRICE_PER_1000.get(kind, 0.0004) / 1000 for kind, n in kinds.items())


# -- Singer input ------------------------------------------------------------------------------------
SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"}, "updated_at": {"type": "string", "format": "date-time"}},
}


def singer(stream_names: list[str], ids: range, tag: str = "v1") -> bytes:
    """Each stream's SCHEMA and a record per id (in ``tag``'s version), then one STATE."""
    lines = []
    for stream in stream_names:
        lines.append({"type": "SCHEMA", "stream": stream, "key_properties": ["id"], "schema": SCHEMA})
        lines += [{"type": "RECORD", "stream": stream, "record": record(i, tag)} for i in ids]
    lines.append({"type": "STATE", "value": {"bookmarks": {stream: {"id": ids[-1]} for stream in stream_names}}})
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def record(i: int, tag: str) -> dict:
    return {"id": i, "name": f"{tag} {i}", "updated_at": f"{DAY}T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"}


# -- running the real commands through the proxy ---------------------------------------------------
class Bench:
    def __init__(self, counter: S3Counter, upstream: str, bucket: str, work: Path, args: argparse.Namespace):
        self.counter, self.upstream, self.bucket, self.work, self.args = counter, upstream, bucket, work, args
        self.env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": KEYS["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": KEYS["secret_access_key"],
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def root(self, name: str) -> str:
        return f"s3://{self.bucket}/{name}"

    def run(self, operation: str, argv: list[str], stdin: bytes | None = None, session: CliSession | None = None) -> tuple[Row, str]:
        """``argv`` in a process of its own (or a ``singerlake`` command in ``session``); its requests (everything
        the proxy saw meanwhile) and wall time."""
        mark = self.counter.mark()
        started = time.perf_counter()
        if session is None:
            done = subprocess.run(argv, input=stdin, capture_output=True, env=self.env, timeout=1800)
            code, out, err = done.returncode, done.stdout.decode(), done.stderr.decode(errors="replace")
        else:
            done = session.run(*argv[1:])
            code, out, err = done.returncode, done.stdout, done.stderr
        wall = time.perf_counter() - started
        if code != 0:
            tail = "\n".join(err.splitlines()[-40:])
            raise SystemExit(f"{tail}\n{operation}: {Path(argv[0]).name} failed with exit code {code} (stderr above)")
        tally = self.counter.since(mark)
        requests = [f"{r.op} {r.key}{' [' + r.condition + ']' if r.condition else ''} -> {r.status}" for r in tally.requests]
        return Row(operation, tally.kinds, tally.bytes_in, tally.bytes_out, wall, requests=requests), out

    def config(self, root: str, **settings) -> str:
        """A plugin's config file: the lake at ``root`` through the proxy."""
        config = {"lake_root": root, "tap_id": TAP, "s3_endpoint_url": self.counter.endpoint, "s3_region": KEYS["region"]}
        config |= {"s3_access_key_id": KEYS["access_key_id"], "s3_secret_access_key": KEYS["secret_access_key"], **settings}
        path = self.work / f"config-{uuid.uuid4().hex[:8]}.json"
        path.write_text(json.dumps(config))
        return str(path)

    def land(self, operation: str, root: str, data: bytes, **settings) -> Row:
        return self.run(operation, [str(BIN / "target-singerlake"), "--config", self.config(root, **settings)], data)[0]

    def replay(self, operation: str, root: str) -> Row:
        return self.run(operation, [str(BIN / "tap-singerlake"), "--config", self.config(root)])[0]

    def cli(self, operation: str, command: str, root: str, *args: str, session: CliSession | None = None) -> tuple[Row, str]:
        s3 = ["--s3-endpoint-url", self.counter.endpoint, "--s3-region", KEYS["region"]]
        return self.run(operation, [str(BIN / "singerlake"), command, root, *s3, *args], session=session)

    def lake(self, root: str, through_proxy: bool = True):
        """The lake at ``root`` opened in this process: through the proxy (counted), or on the server (not)."""
        from singerlake import Lake

        return Lake.open(root, endpoint_url=self.counter.endpoint if through_proxy else self.upstream, **KEYS)

    def commits_and_files(self, root: str, stream: str) -> tuple[int, int]:
        manifest = self.lake(root, through_proxy=False).manifest(TAP, stream)
        return manifest.commits, len(manifest.files)


# -- Delta's floors ----------------------------------------------------------------------------------
def land_floor(streams_: int = 1) -> Counter:
    return Counter({"PUT": 2 * streams_})


def read_floor(commits: int, files: int) -> Counter:
    return Counter({"LIST": 1, "GET": commits + files})


def project_floor(streams_: int, touched: int) -> Counter:
    return Counter({"LIST": 2 * streams_, "GET": (2 + 1 + touched) * streams_, "PUT": 2 * streams_})


FLOORS = {
    "land": "Delta append: the data file and the log entry (PUT 2 a stream; a writer that knows the table's version)",
    "read": "Delta read: LIST of the log, GET of each log entry (a commit) and each data file",
    "project first": "Delta: read the source as a table (LIST 1, GET each log entry and data file), then write the table (PUT 2)",
    "project incremental": "Delta, per stream: the source's new commit (LIST 1, GET its log entry and data file), the table's "
    "latest log entry (LIST 1, GET 1), the table file holding updated keys (GET 1; none for new keys), the new file and log entry (PUT 2)",
    "copy": "a plain copy of the file: one PutObject or GetObject",
}


# -- the operations --------------------------------------------------------------------------------
def one_stream(bench: Bench, rows: list[Row]) -> None:
    a, root = bench.args, bench.root("one")
    r, b, u = a.records, a.batches, a.updates
    rows.append(floored(bench.land("land 1 stream, cold (first run)", root, singer(["users"], range(1, r + 1))), land_floor(), "land"))
    warm = bench.land("land 1 stream, warm (a new run)", root, singer(["users"], range(r + 1, 2 * r + 1)))
    rows.append(floored(warm, land_floor(), "land"))
    # A run of several batches takes the lock at its first (a warm run of one batch goes without it): the
    # further batches are what a run of b batches costs beyond one of b - 1.
    b = max(b, 2)
    fewer = bench.land(f"land 1 stream, {b - 1} batches", root, singer(["users"], range(2 * r + 1, (1 + b) * r + 1)), batch_max_rows=r)
    start = (1 + b) * r + 1
    several = bench.land(f"land 1 stream, {b} batches", root, singer(["users"], range(start, start + b * r)), batch_max_rows=r)
    rows.append(
        Row(
            f"land: each further batch of a run ({b}-batch run − {b - 1}-batch run)",
            minus(several.kinds, fewer.kinds),
            several.bytes_in - fewer.bytes_in,
            several.bytes_out - fewer.bytes_out,
            several.wall_s - fewer.wall_s,
            land_floor(),
            "land",
            [f"(the whole {b}-batch run)", *several.requests],
        )
    )
    commits, files = bench.commits_and_files(root, "users")
    replay = bench.replay(f"replay 1 stream (tap-singerlake; {commits} commits, {files} files)", root)
    rows.append(floored(replay, read_floor(commits, files), "read"))
    first, _ = bench.cli("project 1 stream, first run", "project", root, "--json")
    rows.append(floored(first, read_floor(commits, files) + Counter({"PUT": 2}), "project first"))
    bench.land("(land updated keys)", root, singer(["users"], range(1, u + 1), tag="v2"))
    incremental, _ = bench.cli(f"project 1 stream, incremental ({u} updated keys landed)", "project", root, "--json")
    rows.append(floored(incremental, project_floor(1, touched=1), "project incremental"))


def many_streams(bench: Bench, rows: list[Row]) -> tuple[Row, Row]:
    """The --streams streams: landed cold, projected, landed warm, projected again; returns (warm landing, its project)."""
    a, root = bench.args, bench.root("many")
    names = [f"stream_{i:03d}" for i in range(a.streams)]
    s = a.streams
    cold = bench.land(f"land {s} streams, cold (first run)", root, singer(names, range(1, a.records + 1)))
    rows.append(floored(cold, land_floor(s), "land"))
    first, _ = bench.cli(f"project {s} streams, first run", "project", root, "--json")
    rows.append(floored(first, Counter({"LIST": s, "GET": 2 * s, "PUT": 2 * s}), "project first"))  # per stream: 1 commit, 1 file
    warm = bench.land(f"land {s} streams, warm (a new run)", root, singer(names, range(a.records + 1, a.records + a.updates + 1)))
    rows.append(floored(warm, land_floor(s), "land"))
    incremental, _ = bench.cli(f"project {s} streams, incremental ({a.updates} new records each)", "project", root, "--json")
    rows.append(floored(incremental, project_floor(s, touched=0), "project incremental"))
    return warm, incremental


def files(bench: Bench, rows: list[Row]) -> None:
    root = bench.root("files")
    sources = []
    for n in range(2):
        path = bench.work / f"host-{n}.log"
        path.write_bytes(os.urandom(512) + f"line {n}\n".encode() * 64)
        sources.append(path)
    first, _ = bench.cli("push 1 small file (the lake's first)", "push", root, str(sources[0]), "--what", "bench-log", "--where", "host-0",
                         "--start", f"{DAY}T08:00:00Z", "--json")  # fmt: skip
    rows.append(floored(first, Counter({"PUT": 1}), "copy"))
    later, out = bench.cli("push 1 small file (a later push)", "push", root, str(sources[1]), "--what", "bench-log", "--where", "host-1",
                           "--start", f"{DAY}T09:00:00Z", "--end", f"{DAY}T10:00:00Z", "--json")  # fmt: skip
    rows.append(floored(later, Counter({"PUT": 1}), "copy"))
    file_id = pushed_id(out)
    rows.append(bench.cli("files --what (one day)", "files", root, "--what", "bench-log", "--start", DAY, "--end", NEXT_DAY, "--json")[0])
    rows.append(bench.cli("files --latest", "files", root, "--what", "bench-log", "--latest", "--json")[0])
    fetched, _ = bench.cli("fetch 1 small file", "fetch", root, file_id, "--out", str(bench.work / "fetched.log"), "--json")
    rows.append(floored(fetched, Counter({"GET": 1}), "copy"))


def pushed_id(out: str) -> str:
    result = json.loads(out)
    found = [item["id"] for key in ("pushed", "duplicates") for item in result.get(key, []) if isinstance(item, dict) and "id" in item]
    if not found:
        raise SystemExit(f"push --json printed no id: {out[:500]}")
    return found[0]


def long_run(bench: Bench) -> tuple[list[Row], list[dict]]:
    """--rounds rounds of land-then-project on one stream. The shown rounds' project runs in a process of its own
    (its wall time is a user's); the others' in one CLI session (the same ``main()``, no interpreter start each)."""
    from singerlake import SchemaWriter

    a, root = bench.args, bench.root("long")
    bench.land("(round 1 landing)", root, singer(["events"], range(1, a.records + 1)))
    lake = bench.lake(root)
    schema_message = {"type": "SCHEMA", "stream": "events", "key_properties": ["id"], "schema": SCHEMA}
    shown, series = [], []
    next_id = a.records + 1
    with CliSession(bench.env) as session:
        for n in range(1, a.rounds + 1):
            if n > 1:
                ids = range(next_id, next_id + a.updates)
                next_id += a.updates
                lines = [json.dumps({"type": "RECORD", "stream": "events", "record": record(i, "v1")}).encode() for i in ids]
                with SchemaWriter(lake, TAP, schema_message) as writer:
                    writer.commit([writer.write_file(lines, [1_796_000_000_000 + i for i in ids])])
            own = n in SHOWN_ROUNDS or n == a.rounds
            row, _ = bench.cli(f"project at round {n:,}", "project", root, "--json", session=None if own else session)
            if any(key.endswith(".checkpoint.parquet") for key in row.put_keys):
                row.operation += " (wrote a Delta checkpoint)"
            series.append({"round": n, "process": "own" if own else "session", **row.to_dict()})
            if own:
                shown.append(row)
        if not a.json and n % 10 == 0:
            total = sum(row.kinds.values())
            print(f"  long run: round {n:,} of {a.rounds:,}, project {row.wall_s:.1f} s, {total} requests", file=sys.stderr)
    return shown, series


def floored(row: Row, floor: Counter, floor_is: str) -> Row:
    row.floor, row.floor_is = floor, floor_is
    return row


def monthly(bench: Bench, warm: Row, project: Row, series: list[dict]) -> dict:
    """Per run: the warm landing of the streams, their incremental project, and the long run's growth per stream."""
    s = bench.args.streams
    by_round = {item["round"]: Counter(item["requests"]) for item in series}
    last = max(by_round)
    # The last rounds' mean, over one checkpoint interval (one checkpoint run in it, as in any such stretch of a month)
    recent = [by_round[n] for n in range(max(3, last - CHECKPOINT_INTERVAL + 1), last + 1) if n in by_round]
    mean = Counter({k: sum(c[k] for c in recent) / len(recent) for k in {k for c in recent for k in c}}) if recent else Counter()
    growth = Counter({k: max(n, 0) for k, n in minus(mean, by_round.get(2, mean)).items()}) if last > 2 else Counter()
    per_run = warm.kinds + project.kinds + Counter({k: n * s for k, n in growth.items()})
    floor = land_floor(s) + project_floor(s, touched=0)
    return {
        "runs_per_month": RUNS_PER_MONTH,
        "prices": PRICES,
        "per_run": {kind: per_run.get(kind, 0) for kind in KINDS},
        "growth_per_stream": {kind: growth.get(kind, 0) for kind in KINDS},
        "at_round": last,
        "usd_per_month": round(cost(per_run) * RUNS_PER_MONTH, 2),
        "floor_per_run": {kind: floor.get(kind, 0) for kind in KINDS},
        "floor_usd_per_month": round(cost(floor) * RUNS_PER_MONTH, 2),
    }


# -- output ------------------------------------------------------------------------------------------
def number(n: float) -> str:
    return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.1f}"


def floor_text(floor: Counter | None) -> str:
    if floor is None:
        return ""
    return " ".join(f"{kind} {number(floor[kind])}" for kind in KINDS if floor.get(kind))


def table(rows: list[Row], first: str) -> None:
    print(f"| {first} | " + " | ".join(KINDS) + " | all | KiB in | KiB out | wall s | Delta floor |")
    print("|---|" + "---:|" * (len(KINDS) + 4) + "---|")
    for r in rows:
        kinds = " | ".join(number(r.kinds.get(kind, 0)) for kind in KINDS)
        floor = floor_text(r.floor) + (f" ({list(FLOORS).index(r.floor_is) + 1})" if r.floor_is else "")
        print(f"| {r.operation} | {kinds} | {number(sum(r.kinds.values()))} | {r.bytes_in / 1024:,.1f} | {r.bytes_out / 1024:,.1f} "
              f"| {r.wall_s:.1f} | {floor} |")  # fmt: skip


def report(rows: list[Row], shown: list[Row], month: dict, args: argparse.Namespace) -> None:
    print(f"S3 requests per operation, counted at the HTTP level (moto behind support/s3_counter.py); {args.records} records a batch, "
          f"{args.streams} streams, {args.updates} records per small landing")  # fmt: skip
    print()
    table(rows, "operation")
    print()
    for n, text in enumerate(FLOORS.values(), 1):
        print(f"({n}) {text}")
    print()
    print(f"Long run: {args.rounds:,} rounds of land ({args.updates} new records) then `singerlake project`, one stream")
    print()
    table(shown, "round")
    print()
    per_run = ", ".join(f"{kind} {number(n)}" for kind, n in month["per_run"].items() if n)
    floor = ", ".join(f"{kind} {number(n)}" for kind, n in month["floor_per_run"].items() if n)
    growth = ", ".join(f"{kind} {number(n)}" for kind, n in month["growth_per_stream"].items() if n) or "none"
    print(f"Monthly: {args.streams} streams landed every 5 minutes and projected after each run ({RUNS_PER_MONTH:,} runs a month).")
    print(f"Per run: the warm landing + incremental project of the {args.streams} streams + {args.streams} × the long run's project growth "
          f"per stream from round 2 to rounds {month['at_round'] - CHECKPOINT_INTERVAL + 1:,}-{month['at_round']:,} (their mean, "
          f"a checkpoint among them) ({growth}): {per_run}")  # fmt: skip
    print(f"  singerlake: ${month['usd_per_month']:,.2f} a month; Delta's floor ({floor}): ${month['floor_usd_per_month']:,.2f} a month")
    print(f"  {PRICES}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100, help="records per stream in a landing batch (default 100)")
    parser.add_argument("--batches", type=int, default=3, help="batches of the multi-batch run (default 3)")
    parser.add_argument("--streams", type=int, default=50, help="streams of the many-streams landing and the monthly pipeline (default 50)")
    parser.add_argument("--rounds", type=int, default=100, help="land-then-project rounds of the long run (default 100; 1,000 works)")
    parser.add_argument("--updates", type=int, default=10, help="records of a small landing (updated keys, or new ones) (default 10)")
    parser.add_argument("--json", action="store_true", help="one JSON document instead of the tables")
    parser.add_argument("--verbose", action="store_true", help="also print each operation's requests (operation, key, status)")
    args = parser.parse_args()
    if min(args.records, args.batches, args.streams, args.rounds, args.updates) < 1:
        parser.error("every size must be at least 1")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-requests-") as tmp:
        work = Path(tmp)
        server = start_moto(work)
        try:
            with S3Counter(server.endpoint) as counter:
                bucket = f"bench-{uuid.uuid4().hex[:8]}"
                bench = Bench(counter, server.endpoint, bucket, work, args)
                bench.lake(f"s3://{bucket}", through_proxy=False).storage.client.create_bucket(Bucket=bucket)
                rows: list[Row] = []
                one_stream(bench, rows)
                warm, project = many_streams(bench, rows)
                files(bench, rows)
                shown, series = long_run(bench)
                month = monthly(bench, warm, project, series)
        finally:
            server.stop()
    if args.json:
        document = {"rows": [r.to_dict() for r in rows], "long_run": series, "monthly": month, "floors": FLOORS, "args": vars(args)}
        print(json.dumps(document | {"wall_s": round(time.perf_counter() - started, 1)}, indent=1))
        return
    report(rows, shown, month, args)
    print(f"(bench wall time {time.perf_counter() - started:,.0f} s)")
    if args.verbose:
        for r in [*rows, *shown]:
            areas = Counter(f"{line.split(' ')[0]} {area(line.split(' ')[1])}" for line in r.requests if not line.startswith("("))
            print(f"\n{r.operation}: " + ", ".join(f"{n} {what}" for what, n in areas.most_common()))
            for line in r.requests:
                print(f"  {line}")


def area(key: str) -> str:
    """What part of the lake a key is in: raw, staging, published, the Delta log, files, ... ("" -> the bucket)."""
    if not key:
        return "(bucket)"
    parts = key.split("/")[1:]  # after the lake's root
    if len(parts) < 2:  # the root itself (a listing of it, its write check)
        return "(root)"
    return f"{parts[0]}/_delta_log" if "_delta_log" in parts else parts[0]


if __name__ == "__main__":
    with published("s3_requests"):
        main()
