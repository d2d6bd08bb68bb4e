"""Spark on demand (spark.session.OnDemand, runner.run_items): with a local master, a job of one task
runs in the driver's process and starts no JVM; more tasks, a cluster or Spark Connect start Spark.
`singerlake project` of small streams is such a job: its tables equal those Spark's executors write."""

from __future__ import annotations

import json
import operator
import shutil
import subprocess
import sys
from pathlib import Path

from deltalake import DeltaTable
from lakes import TAP, joined, land, local_lake_at, record_msg, schema_msg
from singerlake import Lake
from singerlake.jobs.project import project
from singerlake.jobs.runner import run_items
from singerlake.spark.session import OnDemand
from test_lake_jobs import spark  # noqa: F401  (the module's session fixture)

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


def test_one_task_on_a_local_master_runs_here_and_more_tasks_start_spark(spark):  # noqa: F811
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


def test_a_small_projection_starts_no_jvm_and_equals_the_executors_tables(tmp_path: Path, spark):  # noqa: F811
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
