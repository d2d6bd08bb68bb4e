"""On the Spark a company already has: a standalone master with two workers and a Spark Connect server,
both started here from the pip pyspark on 127.0.0.1 and stopped by PID.

The executors of these clusters run a Python that does NOT have singerlake (this venv's interpreter
with ``-S``, so none of its ``.pth`` files, and so no editable singerlake, load; its third-party
libraries are on PYTHONPATH): every landing and lake job below works only because the core is
shipped to them. A second interpreter also lacks msgspec: the target must refuse before reading
input, naming it. A worker in a private mount namespace (``unshare --mount``, a tmpfs over the lake's
parent) stands for executors on another machine: a local lake_root is refused, and if the user
claims it is shared, the driver's check of every reported file fails the batch and no STATE covers it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyspark
import pytest
from singerlake import Lake
from singerlake.spark.java import ensure_java
from support.cli_session import CliSession
from support.lakes import s3_lake_at
from support.s3_servers import S3_KEYS, free_port
from support.target_runs import STREAMS, TAP, assert_lake_complete, make_input, read_lake, run_to_end, write_config

pytestmark = pytest.mark.heavy  # a standalone cluster, a Connect server, executor JVMs
# The lakes of these tests live on the real S3 server (SeaweedFS); the S3 suite covers moto too.
on_seaweedfs = pytest.mark.parametrize("s3_server", ["seaweedfs"], indirect=True)

SPARK_HOME = Path(pyspark.__file__).parent
BIN = Path(sys.executable).parent
RECORDS = 6_000
AWS_ENV = {"AWS_ACCESS_KEY_ID": S3_KEYS["access_key_id"], "AWS_SECRET_ACCESS_KEY": S3_KEYS["secret_access_key"]}
AWS_ENV["AWS_DEFAULT_REGION"] = S3_KEYS["region"]


# -- an executor Python without singerlake ---------------------------------------------------------
def python_without(directory: Path, *hidden: str) -> Path:
    """A Python for executors: this venv's libraries, no singerlake, and none of ``hidden`` either."""
    directory.mkdir(parents=True)
    for module in hidden:
        (directory / module).mkdir()
        (directory / module / "__init__.py").write_text(f"raise ModuleNotFoundError({f'No module named {module!r}'!r}, name={module!r})\n")
    site_packages = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    log = directory / "started.log"
    script = directory / "python"
    script.write_text(
        "#!/bin/sh\n"
        f"tr '\\0' ' ' < /proc/$PPID/cmdline >> {log}; echo >> {log}\n"
        f'export PYTHONPATH="{directory}:{site_packages}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        f'exec {sys.executable} -S "$@"\n'
    )
    script.chmod(0o755)
    check = subprocess.run([str(script), "-c", "import singerlake"], capture_output=True, text=True)
    assert check.returncode != 0, "the executor Python must not find singerlake on its own"
    log.unlink(missing_ok=True)
    return script


def started_under_executors(python: Path) -> list[str]:
    """Command lines of the processes that started ``python``, as logged when it started."""
    log = python.parent / "started.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture(scope="module")
def executor_python(tmp_path_factory) -> Path:
    return python_without(tmp_path_factory.mktemp("executor-python") / "env")


# -- servers ---------------------------------------------------------------------------------------
class Servers:
    """Processes started for a test module, stopped by PID (the JVM itself: spark-class execs java)."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, command: list[str], env: dict, wait_port: int) -> subprocess.Popen:
        with open(self.logs / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(proc)
        deadline = time.monotonic() + 120
        while not _listening(wait_port):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{name} did not start; log:\n{(self.logs / f'{name}.log').read_text()[-3000:]}")
            time.sleep(0.3)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def cluster_env(work: Path) -> dict:
    env = {**os.environ, **AWS_ENV, "SPARK_LOCAL_IP": "127.0.0.1", "JAVA_HOME": str(ensure_java())}
    env.update(SPARK_LOG_DIR=str(work / "logs"), SPARK_WORKER_DIR=str(work / "worker"), SPARK_HOME=str(SPARK_HOME))
    return env


def start_standalone(servers: Servers, work: Path, workers: int, worker_prefix: list[str] | None = None) -> str:
    """A master and ``workers`` workers (1 core, 1 GiB each) on loopback; returns the master URL."""
    env = cluster_env(work)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, ui = free_port(), free_port()
    master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)]
    servers.start("master", [spark_class, *master], env, port)
    url = f"spark://127.0.0.1:{port}"
    for n in range(workers):
        worker_port, worker_ui = free_port(), free_port()
        args = ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", str(worker_port)]
        args += ["--webui-port", str(worker_ui), "--cores", "1", "--memory", "1g", "--work-dir", str(work / f"worker-{n}"), url]
        servers.start(f"worker-{n}", [*(worker_prefix or []), spark_class, *args], env, worker_port)
    deadline = time.monotonic() + 60
    while _alive_workers(ui) < workers:
        assert time.monotonic() < deadline, f"only {_alive_workers(ui)} of {workers} workers registered"
        time.sleep(0.3)
    return url


def _alive_workers(ui_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as response:
        return int(json.load(response).get("aliveworkers", 0))


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    work = tmp_path_factory.mktemp("standalone")
    servers = Servers(work)
    try:
        yield start_standalone(servers, work, workers=2)
    finally:
        servers.stop()


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory, executor_python):
    """The Connect server of the pip pyspark, its executors (local[2]) on the Python without singerlake."""
    work = tmp_path_factory.mktemp("connect")
    servers = Servers(work)
    port = free_port()
    env = {**cluster_env(work), "PYSPARK_PYTHON": str(executor_python)}
    command = [str(SPARK_HOME / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    command += ["--master", "local[2]", "--conf", "spark.connect.grpc.binding.address=127.0.0.1"]
    command += ["--conf", f"spark.connect.grpc.binding.port={port}", "--conf", "spark.ui.enabled=false"]
    try:
        servers.start("connect", command, env, port)
        yield f"sc://127.0.0.1:{port}"
    finally:
        servers.stop()


# -- runs ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_input(tmp_path_factory):
    return make_input(
        tmp_path_factory.mktemp("input") / "input.singer.jsonl", records=RECORDS, state_every=3_000
    )  # at most one STATE per batch


def driver_env() -> dict:
    # The driver binds loopback because the test says so, as a user on a loopback cluster would.
    return {**os.environ, **AWS_ENV, "SPARK_LOCAL_IP": "127.0.0.1"}


def run_target(config: Path, small_input, directory: Path, name: str) -> subprocess.CompletedProcess:
    with open(small_input.path, "rb") as stdin:
        return subprocess.run(
            [str(BIN / "target-singerlake"), "--config", str(config)],
            stdin=stdin,
            capture_output=True,
            env=driver_env(),
            timeout=600,
            cwd=directory,
        )


def singerlake_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "singerlake"), *args], capture_output=True, text=True, env=driver_env(), timeout=600)


def replayed(config: dict, directory: Path) -> dict[str, list[bytes]]:
    """tap-singerlake's RECORD messages per stream, re-serialised as the target stores them."""
    tap_config = directory / "tap.json"
    tap_config.write_text(json.dumps({**config, "tap_id": TAP}))
    tap = subprocess.run([str(BIN / "tap-singerlake"), "--config", str(tap_config)], capture_output=True, timeout=300)
    assert tap.returncode == 0, tap.stderr.decode()[-3000:]
    out = tap.stdout
    per_stream: dict[str, list[dict]] = {stream: [] for stream in STREAMS}
    for line in out.splitlines():
        message = json.loads(line)
        if message["type"] == "RECORD":
            per_stream[message["stream"]].append(message["record"])
    return per_stream


def expected_records(small_input) -> dict[str, list[dict]]:
    return {stream: [json.loads(line)["record"] for line in lines] for stream, lines in small_input.per_stream.items()}


DATASOURCE_SCRIPT = """
import json, sys
from singerlake.sources import register
from singerlake.spark.session import spark_session
lake, where, streams = json.loads(sys.argv[1])
spark = spark_session(master=where.get("spark_master"), remote=where.get("spark_remote"), conf=where.get("spark_conf"))
register(spark)
counts = {}
for stream in streams:
    reader = spark.read.format("singerlake").option("tap_id", lake["tap_id"]).option("stream", stream)
    for option in ("endpoint_url", "access_key_id", "secret_access_key", "region"):
        reader = reader.option("s3_" + option, lake["s3_" + option])
    reader.load(lake["lake_root"]).createOrReplaceTempView("records")
    counts[stream] = spark.sql("SELECT count(DISTINCT id) AS n FROM records").first()["n"]
print(json.dumps(counts))
"""


def read_with_datasource(lake_config: dict, where: dict, cli: CliSession) -> dict[str, int]:
    """Distinct ids per stream, read by the data source and Spark SQL on the cluster, from a driver script (not the CLI).

    The script runs in ``cli``'s process, after its commands: its ``spark_session`` finds their Spark application
    (driver, executors with the core shipped and probed) instead of starting one more.
    """
    argument = json.dumps([{**lake_config, "tap_id": TAP}, where, list(STREAMS)])
    result = cli.python(DATASOURCE_SCRIPT, argument)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def land_replay_and_run_jobs(
    lake_config: dict, where: dict, cli_where: list[str], small_input, tmp_path: Path, executor_python: Path
) -> tuple[float, list[str]]:
    """Land on the cluster, replay, then every lake job on the same cluster.

    Returns the landing's wall time and what started the executor Python during the landing.
    """
    config = write_config(tmp_path, "target", **lake_config, **where, batch_max_rows=2_500)
    (executor_python.parent / "started.log").unlink(missing_ok=True)
    started = time.monotonic()
    run = run_to_end(config, small_input.lines, tmp_path, "cluster-landing", driver_env())
    landing_s = time.monotonic() - started
    landing_starters = started_under_executors(executor_python)
    assert run.states() == small_input.states, "every STATE, in order, after its records were committed"
    lake = Lake.open(
        lake_config["lake_root"], **{k: lake_config[f"s3_{k}"] for k in ("endpoint_url", "access_key_id", "secret_access_key", "region")}
    )
    assert_lake_complete(read_lake(lake, small_input), small_input)
    assert replayed(lake_config, tmp_path) == expected_records(small_input), "tap-singerlake replays exactly what was landed"

    s3 = ["--s3-endpoint-url", lake_config["s3_endpoint_url"], "--s3-region", lake_config["s3_region"]]
    root = lake_config["lake_root"]
    # The jobs as one user session runs them: main() once per command in one process, so one Spark application
    # (one driver and one set of executors) serves all five, and then the data source's read, instead of one each
    # (tests/cli_session.py).
    with CliSession(driver_env()) as cli:
        for job in (["verify"], ["repair"], ["compact", "--target-size-mib", "64"], ["project", "--formats", "parquet"], ["verify"]):
            result = cli.run(*job, root, *s3, *cli_where, "--json")
            assert result.returncode == 0, f"singerlake {job[0]} on the cluster: exit {result.returncode}\n{result.stderr[-3000:]}"
            assert "Traceback" not in result.stderr
        counts = read_with_datasource(lake_config, where, cli)
    assert counts == {stream: len(lines) for stream, lines in small_input.per_stream.items()}, "the data source on the cluster"
    compacted = Lake.open(root, **{k: lake_config[f"s3_{k}"] for k in ("endpoint_url", "access_key_id", "secret_access_key", "region")})
    for stream in STREAMS:
        manifest = compacted.manifest(TAP, stream)
        assert len(manifest.files) == 1, f"{stream}: compact on the cluster merged every file into one"
    assert replayed(lake_config, tmp_path) == expected_records(small_input), "after compaction the replay is unchanged"
    return landing_s, landing_starters


@on_seaweedfs
def test_standalone_cluster_lands_replays_and_runs_every_lake_job(standalone, executor_python, small_input, s3_root, tmp_path):
    lake_config = {k: v for k, v in s3_lake_at(s3_root).config.items() if k != "tap_id"}
    where = {"spark_master": standalone, "spark_conf": {"spark.pyspark.python": str(executor_python), "spark.executor.memory": "512m"}}
    cli_where = ["--spark-master", standalone, "--spark-conf", f"spark.pyspark.python={executor_python}"]
    landing_s, starters = land_replay_and_run_jobs(lake_config, where, cli_where, small_input, tmp_path, executor_python)
    print(f"landing of {RECORDS:,} records on a standalone cluster (2 workers): {landing_s:.1f}s")
    # Only executors run Python during a landing: the data files are written there, by the shipped core.
    assert starters, "the executors never started their Python"
    assert all("CoarseGrainedExecutorBackend" in parent for parent in starters), starters[:3]


@on_seaweedfs
def test_spark_connect_lands_replays_and_runs_every_lake_job(connect_server, executor_python, small_input, s3_root, tmp_path):
    lake_config = {k: v for k, v in s3_lake_at(s3_root).config.items() if k != "tap_id"}
    landing_s, starters = land_replay_and_run_jobs(
        lake_config, {"spark_remote": connect_server}, ["--spark-remote", connect_server], small_input, tmp_path, executor_python
    )
    print(f"landing of {RECORDS:,} records over Spark Connect (server on local[2]): {landing_s:.1f}s")
    assert starters, "the Connect server's executors never started their Python"


@on_seaweedfs
def test_executors_missing_a_library_fail_before_any_input_is_read(standalone, small_input, s3_root, tmp_path):
    no_msgspec = python_without(tmp_path / "no-msgspec", "msgspec")
    lake = s3_lake_at(s3_root)
    config = write_config(
        tmp_path,
        "target",
        **{k: v for k, v in lake.config.items() if k != "tap_id"},
        spark_master=standalone,
        spark_conf={"spark.pyspark.python": str(no_msgspec)},
    )
    run = run_target(config, small_input, tmp_path, "missing-library")
    stderr = run.stderr.decode()
    assert run.returncode == 2, stderr[-3000:]
    assert "msgspec" in stderr and "pip install msgspec" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr
    assert run.stdout == b"", "no STATE"
    assert lake.data_keys() == [] and lake.keys() == [], "nothing was landed or even locked: no input was read"


def test_a_local_lake_root_with_a_cluster_is_refused_unless_shared(standalone, small_input, tmp_path):
    config = write_config(tmp_path, "target", lake_root=str(tmp_path / "lake"), spark_master=standalone)
    run = run_target(config, small_input, tmp_path, "refused")
    stderr = run.stderr.decode()
    assert run.returncode == 2, stderr[-3000:]
    assert "setting 'lake_root'" in stderr and "lake_root_shared" in stderr, stderr[-2000:]
    assert "Traceback" not in stderr and run.stdout == b""
    assert not (tmp_path / "lake").exists()

    (tmp_path / "other" / "raw").mkdir(parents=True)  # a lake (with nothing in it yet)
    cli = singerlake_cli("verify", str(tmp_path / "other"), "--spark-master", standalone)
    assert cli.returncode == 2 and "--lake-root-shared" in cli.stderr and "Traceback" not in cli.stderr, cli.stderr


@pytest.fixture
def split_disk_cluster(tmp_path):
    """A master and one worker whose view of ``tmp_path/area`` is its own empty tmpfs: another machine's disk."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) to give a worker its own mount namespace")
    area = tmp_path / "area"
    area.mkdir()
    servers = Servers(tmp_path)
    private = ["unshare", "--mount", "--propagation", "private", "sh", "-c", f'mount -t tmpfs tmpfs "{area}" && exec "$0" "$@"']
    try:
        yield start_standalone(servers, tmp_path, workers=1, worker_prefix=private), area
    finally:
        servers.stop()


def test_files_the_driver_cannot_see_fail_the_batch_and_no_state_covers_them(split_disk_cluster, small_input, tmp_path):
    master, area = split_disk_cluster
    root = area / "lake"
    # The executors run this venv's Python: the test is about the disk, not about what the workers have installed.
    spark_conf = {"spark.pyspark.python": sys.executable}
    config = write_config(tmp_path, "target", lake_root=str(root), spark_master=master, lake_root_shared=True, spark_conf=spark_conf)
    run = run_target(config, small_input, tmp_path, "split-disk")
    stderr = run.stderr.decode()
    assert run.returncode != 0, "a run whose files the driver cannot see must fail"
    assert "is not in the lake's storage" in stderr and ".singer.gz" in stderr, stderr[-3000:]
    assert b'"STATE"' not in run.stdout, "no STATE may cover files that are not in the lake"
    lake = Lake.open(str(root))
    for stream in STREAMS:
        if lake.storage.exists(lake.paths(TAP, stream).manifest):
            assert lake.manifest(TAP, stream).files == [], f"{stream}: nothing committed"
