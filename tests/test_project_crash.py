"""A projection killed at any point (SIGKILL of the run and its Spark processes) leaves each table at
its previous version, and the next run completes it (#23): over the incremental paths that trim a
small stream's parts and update a large stream's buckets, which write their files before the run's
one Delta commit.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from children import spawn
from deltalake import DeltaTable
from lakes import TAP, joined, land, local_lake_at, record_msg, schema_msg
from singerlake import Lake
from singerlake.jobs import delta
from singerlake.storage import LocalStorage
from test_target_crash import kill_tree

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


def project_child(root: str) -> None:
    """Run in a separate process: one projection run of the lake."""
    from singerlake.jobs.project import project
    from singerlake.spark.session import spark_session

    spark = spark_session("local[2]", "singerlake-kill")
    project(Lake(LocalStorage(root)), spark, TAP, small_stream_bytes=SMALL_BYTES, part_rows=PART_ROWS)


def run_to_end(root: Path) -> float:
    started = time.monotonic()
    child = spawn(__file__, "project_child", str(root))
    _, err = child.communicate(timeout=600)
    assert child.returncode == 0, err
    return time.monotonic() - started


def tables(root: Path) -> dict[str, tuple[int, list[dict]]]:
    found = {stream: DeltaTable(str(root / "published" / TAP / stream)) for stream in STREAMS}
    return {stream: (t.version(), sorted(t.to_pyarrow_table().to_pylist(), key=lambda row: row["id"])) for stream, t in found.items()}


def test_a_projection_killed_at_any_point_leaves_the_previous_version_and_the_next_run_completes_it(tmp_path):
    lake_ut = local_lake_at(tmp_path)
    root = lake_ut.area / "lake"
    land(lake_ut.config, joined([line for stream, count in STREAMS.items() for line in records(stream, range(count), "first")]))
    run_to_end(root)
    before = tables(root)
    assert len(before["small"][1]) == 60 and len(before["large"][1]) == 3000
    small, large = (delta.latest(LocalStorage(root), delta.table_key(TAP, stream)).state for stream in STREAMS)
    assert "buckets" not in small and len(small["parts"]) == 6 and large["buckets"] > 1, "the small path in parts, the large in buckets"
    # updates spread over every part and bucket, and new keys
    more = [line for stream, count in STREAMS.items() for line in records(stream, range(0, count + 50, 7), "updated")]
    land(lake_ut.config, joined(more))
    reference = tmp_path / "reference"
    shutil.copytree(root, reference)
    took = run_to_end(reference)
    after = tables(reference)
    assert all(after[s][0] == before[s][0] + 1 and after[s][1] != before[s][1] for s in STREAMS)
    seen = []
    for fraction in (0.5, 0.75, 0.9):
        child = spawn(__file__, "project_child", str(root))
        time.sleep(took * fraction)
        kill_tree(child)
        now = tables(root)
        for stream in STREAMS:
            assert now[stream] in (before[stream], after[stream]), f"{stream}: a killed run leaves the previous version or its own, whole"
        seen.append({stream: now[stream][0] for stream in STREAMS})
    run_to_end(root)
    assert tables(root) == after, "the next run completes what the killed ones began"
    print(f"versions after each kill: {seen}; a run took {took:.1f} s")
