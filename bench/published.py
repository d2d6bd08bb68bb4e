"""``--publish``: a bench's output is also written as its page of the documentation, docs/benchmarks/<bench>.md,
with the command, the time and the machine: one current table per bench, its history in git."""

from __future__ import annotations

import contextlib
import io
import os
import platform
import sys
import time
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
PAGES = {  # bench: (title, what it measures)
    "run": (
        "Landing and replay",
        "target-singerlake beside target-singer-jsonl and target-jsonl, and tap-singerlake beside tap-singer-jsonl and "
        "tap-jsonl, on the same inputs in the same run (`bench/run.py` says what each shape is). Ratios are to our "
        "plugin in the same shape.",
    ),
    "project": (
        "Tables",
        "`singerlake project` beside DuckDB and plain PySpark computing the same current row per key from the same "
        "landed files, each a separate process, alternating between rounds; best of the rounds with the min–max.",
    ),
    "iceberg": (
        "Iceberg beside Delta",
        "`singerlake project --formats delta` against `--formats delta,iceberg` (a SQLite catalog) on copies of one "
        "landed lake, alternating.",
    ),
    "partitioned": (
        "Partitioned tables",
        "`singerlake project --partition-by users=created_at:day` beside the same projection unpartitioned and DuckDB's "
        "`COPY … PARTITION_BY`, then a one-day count on each table; alternating between rounds, best with the min–max.",
    ),
    "files": (
        "Files",
        "`push`, the index's queries and `fetch` beside a plain copy loop and a plain boto3 loop, locally and on a moto "
        "S3 server started by the bench.",
    ),
    "durability": (
        "Durability",
        "Landing and pushing into a local lake with the fsyncs that make a power cut lose nothing acknowledged, beside "
        "a checkout without them, alternating in the same run.",
    ),
    "s3_requests": (
        "S3 requests",
        "Every S3 request of each operation, counted at the HTTP level by a proxy in front of a moto server (the CLIs, "
        "their Spark workers and delta-rs all go through it), beside what a Delta writer or reader knowing its table's "
        "version must send for the same work, and the month's cost of a pipeline.",
    ),
}


class _Tee(io.TextIOBase):
    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def machine() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()[0]
    python = platform.python_version()
    return f"{os.cpu_count()} cores, {memory:.0f} GiB, {platform.machine()}, Python {python}, load average {load:.1f} at the start"


@contextlib.contextmanager
def published(bench: str):
    """Runs the bench; with ``--publish`` on its command line (taken off before the bench parses it), what it
    prints is also written to docs/benchmarks/<bench>.md once it finished without an error."""
    if "--publish" not in sys.argv:
        yield
        return
    sys.argv.remove("--publish")
    title, about = PAGES[bench]
    command = " ".join(["python", f"bench/{bench}.py", *sys.argv[1:]])
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = f"# {title}\n\n{about}\n\nLast run: `{command}`, {started}, {machine()}.\n\n"
    captured = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, captured)):
        yield
    (DOCS / f"{bench}.md").write_text(header + captured.getvalue())
