"""A projection killed at any point (SIGKILL of the run and its Spark processes) leaves each table at
its previous version, or at its own once that table's commit is done, and the next run completes it
(#23): over the incremental paths that trim a small stream's parts and update a large stream's buckets,
which write their files before each table's Delta commit. Each killed run stops itself at a named step
first, so the kill lands at a known point of the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable
from singerlake import Lake
from singerlake.pause import pause_point
from singerlake.storage import LocalStorage
from singerlake.tables import delta
from support.children import _BOOT
from support.lakes import TAP, joined, land, local_lake_at, record_msg, schema_msg
from support.processes import kill_tree, process_state

pytestmark = pytest.mark.heavy  # each run starts Spark in its own process, killed with its workers

STREAMS = {"small": 60, "large": 3000}  # records; under and over SMALL_BYTES stored
SMALL_BYTES = 20_000
HANG_S = 600  # hang detector, not a speed limit
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


def projector(hook: str | None = None) -> None:
    """Run in a separate process: start Spark, say "ready", then one projection run for each lake root read
    from stdin, saying "done" after each. ``hook``: a test step of its own to stop at (see HOOKS), set up first."""
    from singerlake.spark.session import spark_session
    from singerlake.tables.project import project

    if hook:
        HOOKS[hook]()
    spark = spark_session("local[2]", "singerlake-kill")
    print("ready", flush=True)
    for line in sys.stdin:
        project(Lake(LocalStorage(line.strip())), spark, TAP, small_stream_bytes=SMALL_BYTES, part_rows=PART_ROWS)
        print("done", flush=True)


def _stop_once_the_large_streams_parts_are_written() -> None:
    """The large stream's Spark job has written its new bucket parts (the small stream's are written before): stop."""
    from singerlake.tables import buckets

    real = buckets._run_job

    def run_job(*args, **kwargs):
        written = real(*args, **kwargs)
        pause_point("test-large-parts-written")
        return written

    buckets._run_job = run_job


def _stop_once_one_table_is_committed() -> None:
    """The small table's commit done, the large table's held before its own: stop (the large one never goes on)."""
    import threading

    real = delta.commit
    small_done = threading.Event()

    def commit(storage, key, *args, **kwargs):
        if key == delta.table_key(TAP, "large"):
            small_done.wait()
        version = real(storage, key, *args, **kwargs)
        pause_point("test-one-table-committed")
        small_done.set()
        return version

    delta.commit = commit


HOOKS = {
    "test-large-parts-written": _stop_once_the_large_streams_parts_are_written,
    "test-one-table-committed": _stop_once_one_table_is_committed,
}


class Projector:
    """A ``projector`` process (its stderr in a file: Spark's output cannot fill a pipe nobody reads); given a step,
    it stops itself there (SINGERLAKE_PAUSE_AT: ``singerlake.pause``), the first time it gets there."""

    def __init__(self, logs: Path, name: str, step: str | None = None):
        self.log, self.step = logs / f"{name}.stderr", step
        env = {key: value for key, value in os.environ.items() if key != "SINGERLAKE_PAUSE_AT"}
        if step:
            env["SINGERLAKE_PAUSE_AT"] = step
        hook = [step] if step in HOOKS else []
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, __file__, "projector", json.dumps(hook)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
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

    def run_to_end(self, root: Path) -> None:
        self.start(root)
        self.finish()

    def wait_stopped(self) -> None:
        """Until the process has stopped itself at its step (it says so on stderr, then stops)."""
        deadline = time.monotonic() + HANG_S
        while f"paused at {self.step}" not in self.log.read_text(errors="replace") or process_state(self.proc.pid) != "T":
            assert self.proc.poll() is None, f"projector ended before {self.step}; stderr:\n{self.log.read_text(errors='replace')[-3000:]}"
            assert time.monotonic() < deadline, (
                f"projector never reached {self.step}; stderr:\n{self.log.read_text(errors='replace')[-3000:]}"
            )
            time.sleep(0.05)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            assert self.proc.wait(timeout=600) == 0, self.log.read_text(errors="replace")[-3000:]


def tables(root: Path) -> dict[str, tuple[int, list[dict]]]:
    found = {stream: DeltaTable(str(root / "published" / TAP / stream)) for stream in STREAMS}
    return {stream: (t.version(), sorted(t.to_pyarrow_table().to_pylist(), key=lambda row: row["id"])) for stream, t in found.items()}


def data_files(root: Path) -> dict[str, set[str]]:
    """Per stream, the files of its staging and published parts on disk (not its Delta log)."""
    found: dict[str, set[str]] = {stream: set() for stream in STREAMS}
    for place in ("staging", "published"):
        for stream in STREAMS:
            directory = root / place / TAP / stream
            found[stream] |= (
                {str(p) for p in directory.rglob("*") if p.is_file() and "_delta_log" not in p.parts} if directory.exists() else set()
            )
    return found


# Where each killed run stops, and the table versions it leaves: "before" (the previous one) or "after" (the run's own).
KILLS = {
    "test-large-parts-written": {"small": "before", "large": "before"},  # every part file written, no commit
    "project-before-commit": {"small": "before", "large": "before"},  # the commits about to start
    "test-one-table-committed": {"small": "after", "large": "before"},  # one table committed, the other not yet
}


def test_a_projection_killed_at_any_point_leaves_the_previous_version_and_the_next_run_completes_it(tmp_path):
    # Every projection runs in a projector process: "main" does the complete runs, each killed one a run that stops itself
    # at a named step (SINGERLAKE_PAUSE_AT; two steps are this test's own, set up in the process) and is then killed
    # with its Spark processes: each kill lands at a known point of the run, which leaves one known version of each table.
    main = Projector(tmp_path, "main")
    killed = {step: Projector(tmp_path, f"kill-at-{step}", step) for step in KILLS}
    try:
        lake_ut = local_lake_at(tmp_path)
        root = lake_ut.area / "lake"
        land(lake_ut.config, joined([line for stream, count in STREAMS.items() for line in records(stream, range(count), "first")]))
        main.ready()
        main.run_to_end(root)
        before = tables(root)
        assert len(before["small"][1]) == 60 and len(before["large"][1]) == 3000
        small, large = (delta.latest(LocalStorage(root), delta.table_key(TAP, stream)).state for stream in STREAMS)
        assert "buckets" not in small and len(small["parts"]) == 6 and large["buckets"] > 1, "the small path in parts, the large in buckets"
        # updates spread over every part and bucket, and new keys
        more = [line for stream, count in STREAMS.items() for line in records(stream, range(0, count + 50, 7), "updated")]
        land(lake_ut.config, joined(more))
        reference = tmp_path / "reference"
        shutil.copytree(root, reference)
        main.run_to_end(reference)
        after = tables(reference)
        assert all(after[s][0] == before[s][0] + 1 and after[s][1] != before[s][1] for s in STREAMS)
        expected = {"before": before, "after": after}
        for step, child in killed.items():
            files = data_files(root)
            child.ready()
            child.start(root)
            child.wait_stopped()
            kill_tree(child.proc)
            now, written = tables(root), data_files(root)
            for stream, outcome in KILLS[step].items():
                assert now[stream] == expected[outcome][stream], f"killed at {step}: {stream} is not at its {outcome} version"
                assert written[stream] - files[stream], f"killed at {step}: the run had written {stream}'s new parts"
        main.run_to_end(root)
        assert tables(root) == after, "the next run completes what the killed ones began"
        main.close()
    finally:
        for projector in (main, *killed.values()):
            if projector.proc.poll() is None:
                kill_tree(projector.proc)
