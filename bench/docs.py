"""`singerlake docs` on a lived-in lake: STREAMS tables of bench/gen_streams.py's kinds, each landed with
the core (no Spark) as one commit a day for DAYS days, a schema change (a new column) two thirds of the
way, and tap annotations. Times the real command (wall time and peak RSS of its process tree, best of
--repeat) and, with --screenshot, saves headless Chromium's picture of one stream page (the documentation's, docs/stream-page.png).

Usage: python bench/docs.py [--streams 300] [--days 21] [--repeat 3] [--screenshot docs/stream-page.png]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gen_streams import KIND_NAMES, KINDS, STAMP
from measure import measure
from singerlake import Lake, SchemaWriter
from singerlake.site.pages import page_name
from singerlake.storage import LocalStorage
from singerlake.times import now_ms

TAP = "tap-postgres"
ANNOTATIONS = {
    "owner": "Data platform team",
    "description": "The production Postgres, replicated nightly.",
    "docs_url": "https://wiki.example.com/data/tap-postgres",
    "logs_url": "https://logs.example.com/meltano/tap-postgres",
}
DAY = 86_400_000
CLI = str(Path(sys.executable).parent / "singerlake")


def land_stream(lake: Lake, number: int, days: int, start_ms: int) -> None:
    rng = random.Random(number)
    stream, kind = f"public.table_{number:03d}", KIND_NAMES[number % len(KINDS)]
    v1 = {"type": "object", "properties": {"id": {"type": "integer"}, **KINDS[kind], "updated_at": STAMP}}
    v2 = {**v1, "properties": {**v1["properties"], "source": {"type": ["string", "null"]}}}
    change = days * 2 // 3
    next_id = 1
    for schema, day_range in ((v1, range(change)), (v2, range(change, days))):
        message = {"type": "SCHEMA", "stream": stream, "schema": schema, "key_properties": ["id"]}
        with SchemaWriter(lake, TAP, message, annotations=ANNOTATIONS) as writer:
            for day in day_range:
                count = rng.randint(5, 60) * (2 if day % 7 < 5 else 1)  # quieter weekends
                times = sorted(start_ms + day * DAY + rng.randrange(DAY) for _ in range(count))
                lines = [json.dumps({"type": "RECORD", "stream": stream, "record": {"id": next_id + i}}).encode() for i in range(count)]
                next_id += count
                writer.commit([writer.write_file(lines, times)], publish=day == day_range[-1])


def build_lake(root: Path, streams: int, days: int) -> None:
    lake = Lake(LocalStorage(root))
    start = now_ms() - days * DAY
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: land_stream(lake, n, days, start), range(streams)))


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def screenshot(page: Path, out: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("no chromium: no screenshot (./dev installs Debian's chromium as root)")
        return
    with tempfile.TemporaryDirectory() as profile:
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}"]
        subprocess.run([chromium, *flags, "--window-size=1100,1500", f"--screenshot={out}", page.as_uri()], check=True, capture_output=True)
    print(f"screenshot of {page.name}: {out} ({out.stat().st_size:,} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--days", type=int, default=21)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--screenshot", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as area:
        root, site = Path(area) / "lake", Path(area) / "site"
        started = time.perf_counter()
        build_lake(root, args.streams, args.days)
        print(f"lake: {args.streams} streams x {args.days} commits (2 versions each), landed in {time.perf_counter() - started:.1f} s")
        runs, cpu = [], []
        for _ in range(args.repeat):
            before = children_cpu_s()
            runs.append(measure([CLI, "docs", str(root), "--out", str(site)], None))
            cpu.append(children_cpu_s() - before)  # unlike wall time, barely moved by other work on the machine
        best = min(runs, key=lambda m: m.wall_s)
        pages = list(site.rglob("*.html"))
        size = sum(p.stat().st_size for p in pages)
        spread = f"{min(m.wall_s for m in runs):.2f}-{max(m.wall_s for m in runs):.2f}"
        print(f"singerlake docs: {best.wall_s:.2f} s (best of {args.repeat}: {spread} s), CPU {min(cpu):.2f} s")
        print(f"peak RSS {best.peak_rss_mb:.0f} MiB")
        print(f"site: {len(pages)} pages, {size / 1024:,.0f} KiB")
        if args.screenshot:
            screenshot(site / page_name(TAP, "public.table_001"), args.screenshot.resolve())


if __name__ == "__main__":
    main()
