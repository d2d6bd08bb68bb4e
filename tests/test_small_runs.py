"""What a small run pays beyond Spark itself (issue #11): its Python workers start from compiled
modules and its executors' writes import nothing they do not use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyspark
from singerlake.format.datafile import gzip_member
from singerlake.landing.spark_write import Chunk, batch_table
from singerlake.spark.session import driver_options

WORKER_PROBE = """
import json, sys
from singerlake.spark.session import spark_session

def probe(batches):
    import pyarrow as pa
    import pyspark
    for _ in batches:
        pass
    zips = [entry for entry in sys.path if entry.endswith("pyspark.zip")]
    yield pa.RecordBatch.from_pydict({"found": [json.dumps({"pyspark": pyspark.__file__, "zips": zips})]})

spark = spark_session("local[1]")
print(spark.range(1).mapInArrow(probe, "found string").collect()[0].found)
"""


def test_local_python_workers_import_the_installed_pyspark_not_the_uncompiled_zip():
    """Spark puts pyspark.zip first on its workers' path, compiled again at every worker start."""
    result = subprocess.run([sys.executable, "-c", WORKER_PROBE], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"pyspark": pyspark.__file__, "zips": []}


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


EXECUTOR_WRITE = """
import sys
import pyarrow as pa
from singerlake import Lake, open_storage
from singerlake.format.datafile import gzip_member
from singerlake.spark.runner import _run_partition
from singerlake.landing.spark_write import FileJob, write_partition

lake = Lake(open_storage(sys.argv[1]))
batches = pa.ipc.open_file(sys.argv[2]).read_all().to_batches()
job = FileJob(lake.storage, lake.paths("tap-x", "users"), "1234567890123", gzip_member(b'{"type":"SCHEMA"}\\n', 6), 1 << 20, None, {})
rows = [row for batch in write_partition([job], iter(batches)) for row in batch.to_pylist()]
items = pa.ipc.open_file(sys.argv[3]).read_all().to_batches()
results = [row for batch in _run_partition(lambda item: item["n"] * 2, 2, iter(items)) for row in batch.to_pylist()]
print(len(rows), results, "pandas" in sys.modules)
"""


def test_executors_writing_a_batch_or_running_a_lake_job_do_not_import_pandas(tmp_path: Path):
    """pandas takes a worker about 0.3 s to import, on the critical path of every first batch and job."""
    lines = b'{"type":"RECORD","stream":"users","record":{"id":1}}\n'
    batch = arrow_file(tmp_path / "batch.arrow", batch_table([[Chunk(gzip_member(lines, 6), len(lines), 1, 5, 6)]]))
    items = arrow_file(tmp_path / "items.arrow", pa.table({"seq": [0, 1], "item": ['{"n": 1}', '{"n": 5}']}))
    result = subprocess.run(
        [sys.executable, "-c", EXECUTOR_WRITE, str(tmp_path / "lake"), str(batch), str(items)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "1 [{'seq': 0, 'result': '2'}, {'seq': 1, 'result': '10'}] False"
    assert len(list((tmp_path / "lake").rglob("*.singer.gz"))) == 1


def arrow_file(path: Path, table) -> Path:
    with pa.ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)
    return path
