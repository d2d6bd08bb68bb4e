"""A projection killed at any point (SIGKILL of the run and its Spark processes) leaves each table at
its previous version, and the next run completes it (#23): over the incremental paths that trim a
small stream's parts and update a large stream's buckets, which write their files before the run's
one Delta commit.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable
from singerlake import Lake
from singerlake.storage import LocalStorage
from singerlake.tables import delta
from support.children import _BOOT
from support.lakes import TAP, joined, land, local_lake_at, record_msg, schema_msg
from support.processes import kill_tree

pytestmark = pytest.mark.heavy  # each run starts Spark in its own process, killed with its workers

STREAMS = {"small": 60, "large": 3000}  # records; under and over SMALL_BYTES stored
SMALL_BYTES = 20_000
PART_ROWS = 10  # the small stream's rows in several parts
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "n": {"type": "number"},
        "s": {"type": "string"},
        "at": {"type": "string", "format": "date-time"},
    },
}


def records(stream: str, keys: range, note: str) -> list[bytes]:
    lines = [schema_msg(stream, SCHEMA, ["id"])]
    return lines + [record_msg(stream, {"id": k, "n": k / 4, "s": f"{note} {k}", "at": f"2024-01-01T00:00:{k % 60:02d}Z"}) for k in keys]


def projector() -> None:
    """Run in a separate process: start Spark, say "ready", then one projection run for each lake root read
    from stdin, saying "done" after each."""
    from singerlake.spark.session import spark_session
    from singerlake.tables.project import project

    spark = spark_session("local[2]", "singerlake-kill")
    print("ready", flush=True)
    for line in sys.stdin:
        project(Lake(LocalStorage(line.strip())), spark, TAP, small_stream_bytes=SMALL_BYTES, part_rows=PART_ROWS)
        print("done", flush=True)


class Projector:
    """A ``projector`` process (its stderr in a file: Spark's output cannot fill a pipe nobody reads)."""

    def __init__(self, logs: Path, name: str):
        self.log = logs / f"{name}.stderr"
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, __file__, "projector", "[]"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )

    def _expect(self, word: str) -> None:
        line = "-"
        while line and line.strip() != word:  # skips anything else the process printed; "" is its end
            line = self.proc.stdout.readline()
        assert line.strip() == word, f"projector said {line!r}, not {word!r}; stderr:\n{self.log.read_text(errors='replace')[-3000:]}"

    def ready(self) -> None:
        self._expect("ready")

    def start(self, root: Path) -> None:
        self.proc.stdin.write(f"{root}\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        self._expect("done")

    def run_to_end(self, root: Path) -> float:
        """One projection of ``root`` on this process's Spark session; returns its wall time."""
        started = time.monotonic()
        self.start(root)
        self.finish()
        return time.monotonic() - started

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            assert self.proc.wait(timeout=600) == 0, self.log.read_text(errors="replace")[-3000:]


def tables(root: Path) -> dict[str, tuple[int, list[dict]]]:
    found = {stream: DeltaTable(str(root / "published" / TAP / stream)) for stream in STREAMS}
    return {stream: (t.version(), sorted(t.to_pyarrow_table().to_pylist(), key=lambda row: row["id"])) for stream, t in found.items()}


def test_a_projection_killed_at_any_point_leaves_the_previous_version_and_the_next_run_completes_it(tmp_path):
    # Every projection runs in a projector process: "main" does the complete runs, each "kill-N" one run that is killed.
    # A process's first projection costs ~10x a later one (Python workers, codegen), so the killed processes first
    # project a copy of the lake of their own, alongside main's first run, and are killed at fractions of the time main's
    # (equally warm) run on the reference copy took: the kills fall inside the projection, not inside Spark's warm-up.
    main, *killed = (Projector(tmp_path, name) for name in ("main", "kill-1", "kill-2", "kill-3"))
    try:
        lake_ut = local_lake_at(tmp_path)
        root = lake_ut.area / "lake"
        land(lake_ut.config, joined([line for stream, count in STREAMS.items() for line in records(stream, range(count), "first")]))
        warm_ups = [tmp_path / f"warm-up-{number}" for number in range(len(killed))]
        for warm_up in warm_ups:
            shutil.copytree(root, warm_up)
        for projector, lake_root in zip((main, *killed), (root, *warm_ups), strict=True):
            projector.ready()
            projector.start(lake_root)
        for projector in (main, *killed):
            projector.finish()
        before = tables(root)
        assert len(before["small"][1]) == 60 and len(before["large"][1]) == 3000
        small, large = (delta.latest(LocalStorage(root), delta.table_key(TAP, stream)).state for stream in STREAMS)
        assert "buckets" not in small and len(small["parts"]) == 6 and large["buckets"] > 1, "the small path in parts, the large in buckets"
        # updates spread over every part and bucket, and new keys
        more = [line for stream, count in STREAMS.items() for line in records(stream, range(0, count + 50, 7), "updated")]
        land(lake_ut.config, joined(more))
        reference = tmp_path / "reference"
        shutil.copytree(root, reference)
        took = main.run_to_end(reference)
        after = tables(reference)
        assert all(after[s][0] == before[s][0] + 1 and after[s][1] != before[s][1] for s in STREAMS)
        seen = []
        for fraction, child in zip((0.5, 0.75, 0.9), killed, strict=True):
            child.start(root)
            time.sleep(took * fraction)
            kill_tree(child.proc)
            now = tables(root)
            for stream in STREAMS:
                whole = f"{stream}: a killed run leaves the previous version or its own, whole"
                assert now[stream] in (before[stream], after[stream]), whole
            seen.append({stream: now[stream][0] for stream in STREAMS})
        main.run_to_end(root)
        assert tables(root) == after, "the next run completes what the killed ones began"
        print(f"versions after each kill: {seen}; a run took {took:.1f} s")
        main.close()
    finally:
        for projector in (main, *killed):
            if projector.proc.poll() is None:
                kill_tree(projector.proc)
