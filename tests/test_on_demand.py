"""Spark on demand (spark.session.OnDemand, runner.run_items): with a local master, a job of one task
runs in the driver's process and starts no JVM; more tasks, a cluster or Spark Connect start Spark.
`singerlake project` of small streams is such a job, and so is a large stream's run of a few updated keys
(one task reads, one writes): their tables equal those Spark's executors write."""

from __future__ import annotations

import json
import operator
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pyarrow.compute as pc
from deltalake import DeltaTable
from singerlake import Lake
from singerlake.spark.runner import run_items
from singerlake.spark.session import OnDemand
from singerlake.tables.project import project
from support.lakes import TAP, joined, land, local_lake_at, record_msg, schema_msg

SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "amount": {"type": "number"}, "at": {"type": "string", "format": "date-time"}},
}
CLI_THEN_JVM = """
import sys
from pyspark import SparkContext
from singerlake.cli.main import main
code = main(sys.argv[1:])
print("JVM started" if SparkContext._gateway is not None else "no JVM", file=sys.stderr)
sys.exit(code)
"""


def test_one_task_on_a_local_master_runs_here_and_more_tasks_start_spark(spark):
    started = []

    def start():
        started.append(True)
        return spark

    items, work = [{"n": n} for n in range(6)], operator.itemgetter("n")
    here = OnDemand(start, "local[2]")
    assert run_items(here, items, work, items_per_task=6) == list(range(6))
    assert started == []
    assert run_items(here, items, work, items_per_task=2) == list(range(6))  # three tasks: on Spark's executors
    assert started == [True]
    assert not OnDemand(start, "local-cluster[2,1,1024]").in_process  # executors in processes of their own
    assert not OnDemand(start, None, "sc://127.0.0.1:15002").in_process
    assert OnDemand(start, None).in_process  # the embedded default, local[*]


def test_a_small_projection_starts_no_jvm_and_equals_the_executors_tables(tmp_path: Path, spark):
    lake = local_lake_at(tmp_path)
    records = [{"id": n % 40, "amount": n / 8, "at": f"2024-01-01T00:00:{n % 60:02d}Z"} for n in range(100)]
    land(lake.config, joined([schema_msg("orders", SCHEMA, ["id"]), *(record_msg("orders", r) for r in records)]))
    root = Path(lake.config["lake_root"])
    copy = shutil.copytree(root, tmp_path / "copy")

    run = subprocess.run(
        [sys.executable, "-c", CLI_THEN_JVM, "project", lake.config["lake_root"], "--json"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip().endswith("no JVM")
    assert [r["rows"] for r in json.loads(run.stdout)["streams"]] == [40]

    project(Lake.open(str(copy)), spark)  # a session: the stream's task runs in a Spark Python worker
    here, there = (DeltaTable(str(where / "published" / TAP / "orders")) for where in (root, copy))
    assert here.schema() == there.schema()
    assert here.to_pyarrow_table().sort_by("id").equals(there.to_pyarrow_table().sort_by("id"))
    states = [table.history(1)[0]["singerlake"] for table in (here, there)]
    same = [{key: value for key, value in state.items() if key != "parts"} for state in states]  # parts: other file names
    assert same[0] == same[1] and same[0]["types"]
    assert [[(part["rows"], part["needs"]) for part in state["parts"]] for state in states] == [[(40, same[0]["types"])]] * 2


def test_a_few_updated_keys_of_a_large_stream_start_no_jvm_and_equal_the_executors_tables(tmp_path: Path, spark):
    small = 16 << 10  # bytes: the stream is large, in buckets of 2 KiB
    lake = local_lake_at(tmp_path)
    records = [{"id": n, "amount": n / 8, "at": f"2024-01-01T00:{n % 60:02d}:00Z"} for n in range(3000)]
    land(lake.config, joined([schema_msg("orders", SCHEMA, ["id"]), *(record_msg("orders", r) for r in records)]))
    root = Path(lake.config["lake_root"])
    first = project(Lake.open(str(root)), spark, small_stream_bytes=small)[0]  # many tasks: on the executors
    copy = shutil.copytree(root, tmp_path / "copy")
    updates = [{"id": n, "amount": -n / 4, "at": "2024-02-01T00:00:00.5Z"} for n in (7, 1500, 2999)]
    for where in (root, copy):
        land(
            {**lake.config, "lake_root": str(where)},
            joined([schema_msg("orders", SCHEMA, ["id"]), *(record_msg("orders", r) for r in updates)]),
        )

    started = []
    here = project(Lake.open(str(root)), OnDemand(lambda: started.append(True) or spark, "local[2]"), small_stream_bytes=small)[0]
    assert started == []  # one task reads the three records and one writes their buckets: in this process
    there = project(Lake.open(str(copy)), spark, small_stream_bytes=small)[0]
    assert here["version"] == there["version"] == first["version"] + 1
    tables = [DeltaTable(str(where / "published" / TAP / "orders")) for where in (root, copy)]
    assert tables[0].schema() == tables[1].schema()
    rows = [table.to_pyarrow_table().sort_by("id") for table in tables]
    assert rows[0].equals(rows[1]) and rows[0].num_rows == 3000
    assert rows[0].filter(pc.equal(rows[0]["id"], 1500))["amount"].to_pylist() == [Decimal("-375")]
    states = [table.history(1)[0]["singerlake"] for table in tables]
    assert [sorted((part["bucket"], part["rows"]) for part in state["parts"]) for state in states] == [
        sorted((part["bucket"], part["rows"]) for part in states[1]["parts"])
    ] * 2
    assert len(states[0]["parts"]) == states[0]["buckets"] > 3
