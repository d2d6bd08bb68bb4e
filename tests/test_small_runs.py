"""What a small run pays beyond Spark itself (issue #11): its Python workers start from compiled
modules and its executors' writes import nothing they do not use."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyspark
import pytest
from singerlake.spark.session import driver_options

# One local[1] session; each probe runs in its Python worker and answers in rows built from buffers, as the
# executors' code does (``pa.array`` of Python values would import pandas there itself).
WORKER_PROBE = """
import json, os, sys
import pyarrow as pa
from singerlake import Lake, open_storage
from singerlake.format.datafile import gzip_member
from singerlake.landing import spark_write
from singerlake.spark import runner
from singerlake.spark.results import result_batch, result_schema
from singerlake.spark.session import spark_session

lake = Lake(open_storage(sys.argv[1]))
lines = b'{"type":"RECORD","stream":"users","record":{"id":1}}\\n'
schema = gzip_member(b'{"type":"SCHEMA"}\\n', 6)
job = spark_write.FileJob(lake.storage, lake.paths("tap-x", "users"), "1234567890123", schema, 1 << 20, None, {})
batch = spark_write.batch_table([[spark_write.Chunk(gzip_member(lines, 6), len(lines), 1, 5, 6)]])
items = pa.table({"seq": pa.array([0, 1], pa.int64()), "item": pa.array(['{"n": 1}', '{"n": 5}'])})


def imported(before):
    return json.dumps({"pid": os.getpid(), "pandas_before": before, "pandas_after": "pandas" in sys.modules})


def write(batches):  # a landing's executor side (what write_with_spark runs), then what the worker imported
    before = "pandas" in sys.modules
    yield from spark_write.write_partition([job], batches)
    yield result_batch(spark_write.RESULT_COLUMNS, segment=[-1], first_chunk=[-1], meta=[imported(before)])


def lake_job(batches):  # a lake job's executor side (what runner.run_items runs), then what the worker imported
    before = "pandas" in sys.modules
    yield from runner._run_partition(lambda item: item["n"] * 2, 2, batches)
    yield result_batch(runner.RESULT_COLUMNS, seq=[-1], result=[imported(before)])


def paths(batches):
    import pyspark
    for _ in batches:
        pass
    zips = [entry for entry in sys.path if entry.endswith("pyspark.zip")]
    yield result_batch({"found": "string"}, found=[json.dumps({"pyspark": pyspark.__file__, "zips": zips})])


def full_collections(batches):  # how many full collections this worker has run so far
    import gc
    for _ in batches:
        pass
    yield result_batch({"found": "string"}, found=[json.dumps([os.getpid(), gc.get_stats()[2]["collections"]])])


spark = spark_session("local[1]")
written = spark.createDataFrame(batch).mapInArrow(write, result_schema(**spark_write.RESULT_COLUMNS)).collect()
ran = spark.createDataFrame(items).mapInArrow(lake_job, result_schema(**runner.RESULT_COLUMNS)).collect()
found = spark.range(1).mapInArrow(paths, result_schema(found="string")).collect()
collections = [json.loads(spark.range(1).mapInArrow(full_collections, result_schema(found="string")).collect()[0].found) for _ in range(6)]
print(json.dumps({
    "collections": collections,
    "written": sorted([row.segment, row.meta] for row in written),
    "ran": sorted([row.seq, row.result] for row in ran),
    "paths": json.loads(found[0].found),
}))
"""


@pytest.fixture(scope="module")
def workers(tmp_path_factory) -> dict:
    """What the probes found in the Python workers of one real local Spark session (started in a process of its own)."""
    lake = tmp_path_factory.mktemp("small-runs") / "lake"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, "-c", WORKER_PROBE, str(lake)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    found["data_files"] = len(list(lake.rglob("*.singer.gz")))
    return found


def test_local_python_workers_import_the_installed_pyspark_not_the_uncompiled_zip(workers):
    """Spark puts pyspark.zip first on its workers' path, compiled again at every worker start."""
    assert workers["paths"] == {"pyspark": pyspark.__file__, "zips": []}


def test_a_reused_worker_does_not_walk_all_its_objects_after_each_task(workers):
    """pyspark's daemon runs a full collection after every task of a reused worker (50-340 ms each, none freeing
    anything in a 10M projection); ours collects the young generations there."""
    pids = {pid for pid, _ in workers["collections"]}
    counts = [count for _, count in workers["collections"]]
    assert len(pids) == 1, workers["collections"]  # one reused worker ran the six tasks
    assert counts[-1] - counts[0] <= 1, workers["collections"]  # pyspark's own daemon: one more after each task


def test_workers_of_another_interpreter_keep_sparks_own_daemon(monkeypatch):
    """The daemon module is ours: only workers running this installation can import it."""
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    assert driver_options("local[2]")["spark.python.daemon.module"] == "singerlake.spark.worker_daemon"
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    assert "spark.python.daemon.module" not in driver_options("local[2]")
    assert "spark.python.daemon.module" not in driver_options("spark://127.0.0.1:7077")


def test_a_users_jvm_options_add_to_ours():
    """``--spark-conf spark.driver.extraJavaOptions=-verbose:gc`` must not drop our log4j layout (the
    JVM banners would come back), CDS or OOM exit: the user's flags go last, so theirs win a conflict."""
    ours = driver_options("local[2]")
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        mixed = driver_options("local[2]", {key: "-verbose:gc"})[key]
        assert mixed == f"{ours[key]} -verbose:gc"
    assert "-Dlog4j.configurationFile=" in ours["spark.driver.extraJavaOptions"]
    assert driver_options("local[2]", {"spark.driver.memory": "3g"})["spark.driver.memory"] == "3g"


def test_executors_writing_a_batch_or_running_a_lake_job_do_not_import_pandas(workers):
    """pandas takes a worker about 0.3 s to import, on the critical path of every first batch and job: a real worker
    ran a landing's write and a lake job's items, then found no pandas among its modules (nor before: it is conclusive)."""
    (report_segment, report), *files = workers["written"]
    assert report_segment == -1 and [segment for segment, _ in files] == [0] and workers["data_files"] == 1
    (report_seq, job_report), *results = workers["ran"]
    assert report_seq == -1 and results == [[0, "2"], [1, "10"]]
    for imported in (json.loads(report), json.loads(job_report)):
        assert imported["pandas_before"] is False and imported["pandas_after"] is False, imported


SMALL_PROJECT = """
import json, sys
from singerlake import Lake, open_storage
from singerlake.spark.session import OnDemand
from singerlake.tables.project import project


def no_spark():
    raise AssertionError("a run of one task on a local master starts no Spark")


results = project(Lake(open_storage(sys.argv[1])), OnDemand(no_spark, "local[2]"))
imported = "pandas" in sys.modules
import pyarrow as pa

frame = pa.table({"id": [1, 2]}).to_pandas()  # pyarrow still finds pandas for what needs it
print(json.dumps({"rows": [r["rows"] for r in results], "pandas": imported, "frame": list(frame["id"])}))
"""


def test_a_small_projection_imports_no_pandas_and_pandas_still_works_after(tmp_path):
    """pyarrow imports pandas (0.3-1 s) at its first conversion of Python values: a small run's projection, in the
    driver, finds no pandas among its modules after it, and ``to_pandas`` still works after that."""
    from support.lakes import land, local_lake_at, record_msg, schema_msg, state_msg

    lake = local_lake_at(tmp_path)
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
    lines = [schema_msg("users", schema, ["id"]), *(record_msg("users", {"id": i, "name": f"n{i}"}) for i in range(3))]
    land(lake.config, b"\n".join([*lines, state_msg({"done": 1})]) + b"\n")
    result = subprocess.run([sys.executable, "-c", SMALL_PROJECT, lake.config["lake_root"]], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"rows": [3], "pandas": False, "frame": [1, 2]}
