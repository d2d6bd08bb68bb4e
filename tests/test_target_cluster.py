"""target-singerlake on a Spark cluster whose executors are separate processes (local-cluster mode).

``local-cluster[2,1,1024]`` starts a standalone master and two workers inside the driver JVM; each
executor is its own JVM (``CoarseGrainedExecutorBackend``) and runs the Python workers that write
the data files. The runs below land into a local lake and into S3 (moto over HTTP) and check the
lake is complete and correct, and that every data file was written by a process under an
executor JVM, never by the driver.

Who wrote a file is observed from outside the code under test: the runs get a ``sitecustomize``
on PYTHONPATH (inherited by the driver, the executors and their Python workers) that wraps the
storage classes' ``write`` and logs, for each data file key, the writing process and its
ancestors. A local[*] run is the control: there the writers sit under the driver's JVM, and the
same check tells them apart.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from singerlake import Lake
from support.probes import CLUSTER, nearest_jvm, probed_env, writers
from support.target_runs import STATE_EVERY, assert_lake_complete, make_input, read_lake, run_to_end, write_config

pytestmark = pytest.mark.heavy  # local-cluster: a master, workers and executor JVMs per test

RECORDS = 12_000  # 3 batches of BATCH_ROWS: 6 files, 2 STATEs; the run is mostly the cluster's start


@pytest.fixture(scope="module")
def small_input(tmp_path_factory):
    return make_input(tmp_path_factory.mktemp("input") / "input.singer.jsonl", records=RECORDS)


SPARK_ERROR = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \| ERROR .*$", re.M)  # singerlake/log4j2.properties
RETRIED = tuple(f"will retry ({n}/5)." for n in range(1, 5))  # Spark's own retries, not the last one
# A one-way RPC message that reached an endpoint already stopping, at the application's end under load.
BENIGN = (*RETRIED, "Error while invoking RpcHandler#receive() for one-way message from 127.0.0.1/127.0.0.1:")


def land(config: Path, small_input, tmp_path: Path, env: dict):
    run = run_to_end(config, small_input.lines, tmp_path, "cluster-run", env)
    assert run.states() == small_input.states, "every STATE, in order, after its records were committed"
    # The application ends cleanly: no executor relaunches, no "application FAILED" after success.
    # (A message Spark retries itself, or a one-way message at the end, under load, is no failure.)
    errors = [line for line in SPARK_ERROR.findall(run.stderr) if not any(benign in line for benign in BENIGN)]
    assert not errors, "a successful run logged Spark errors:\n" + "\n".join(errors[:10])
    return run


def check_written_by_executors(lake: Lake, small_input, log: Path, driver_pid: int) -> None:
    view = read_lake(lake, small_input)
    assert_lake_complete(view, small_input)
    assert not view.orphans and not view.locks
    committed = set().union(*view.committed.values())
    assert len(committed) >= RECORDS // STATE_EVERY, "expected several batches of files"

    written = writers(log)
    missing = committed - set(written)
    assert not missing, f"committed files the probe never saw written: {sorted(missing)[:3]}"
    executors = set()
    for key in committed:
        entry = written[key]
        assert entry["pid"] != driver_pid, f"{key} was written by the driver process"
        jvm = nearest_jvm(entry)
        assert "CoarseGrainedExecutorBackend" in jvm["cmdline"], (
            f"{key} was written under a JVM that is not an executor: {jvm['cmdline'][:300]}"
        )
        executors.add(jvm["pid"])
    driver_jvms = {p["pid"] for entry in written.values() for p in entry["ancestry"] if "SparkSubmit" in p["cmdline"]}
    assert not executors & driver_jvms, "an executor JVM is the driver's JVM"


def test_local_cluster_executors_write_a_local_lake(small_input, tmp_path):
    root = tmp_path / "lake"
    config = write_config(tmp_path, "config", lake_root=str(root), spark_master=CLUSTER)
    env, log = probed_env(tmp_path)
    run = land(config, small_input, tmp_path, env)
    check_written_by_executors(Lake.open(str(root)), small_input, log, run.proc.pid)


@pytest.mark.parametrize("s3_server", ["seaweedfs"], indirect=True)  # the real S3 server; moto added 32 s of CI for the same path
def test_local_cluster_executors_write_an_s3_lake(small_input, tmp_path, s3_root):
    url, options = s3_root
    settings = {f"s3_{name}": value for name, value in options.items()}
    config = write_config(tmp_path, "config", lake_root=url, spark_master=CLUSTER, **settings)
    env, log = probed_env(tmp_path)
    run = land(config, small_input, tmp_path, env)
    check_written_by_executors(Lake.open(url, **options), small_input, log, run.proc.pid)


def test_probe_control_local_mode_writers_sit_under_the_driver_jvm(small_input, tmp_path):
    """The check above can fail: in local[*] mode the writers' nearest JVM is the driver's own."""
    root = tmp_path / "lake"
    config = write_config(tmp_path, "config", lake_root=str(root), spark_master="local[2]")
    env, log = probed_env(tmp_path)
    run = land(config, small_input, tmp_path, env)
    view = read_lake(Lake.open(str(root)), small_input)
    assert_lake_complete(view, small_input)
    written = writers(log)
    committed = set().union(*view.committed.values())
    assert committed and committed <= set(written)
    for key in committed:
        jvm = nearest_jvm(written[key])
        assert "CoarseGrainedExecutorBackend" not in jvm["cmdline"]
        assert "SparkSubmit" in jvm["cmdline"] and any(p["pid"] == run.proc.pid for p in written[key]["ancestry"])
    with pytest.raises(AssertionError, match="not an executor"):
        check_written_by_executors(Lake.open(str(root)), small_input, log, run.proc.pid)
