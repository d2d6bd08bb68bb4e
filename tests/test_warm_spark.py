"""The warm Spark of one machine (a local Spark Connect server kept between runs): `singerlake spark
start|status|stop`, runs attached to it, its idle stop, the fall-back when it cannot start, and what a
second session on a Connect server costs: no upload of the core, no check job (Spark's own job list).

Each test has its own discovery directory and stops, by pid, whatever server and watcher it started.
Waits below detect hangs; nothing asserts speed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # each test starts a Spark Connect server JVM

BIN = Path(sys.executable).parent
HANG_S = 180
SESSION = """
from pyspark.sql.connect.client.artifact import ArtifactManager
shipped = []
add_artifacts = ArtifactManager.add_artifacts
def spy(self, *paths, **kinds):
    shipped.extend(paths)
    return add_artifacts(self, *paths, **kinds)
ArtifactManager.add_artifacts = spy
from singerlake.spark.session import spark_session
spark_session()
print(len(shipped))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def warm(tmp_path):
    """The environment of runs on a private warm Spark; afterwards its server and watcher are gone."""
    folder = tmp_path / "warm"
    env = {**os.environ, "SPARK_LOCAL_CONNECT_DISCOVERY": str(folder / "connect-local.json"), "SINGERLAKE_SPARK_WARM": "true"}
    env.pop("SPARK_REMOTE", None)
    yield env
    for pid in (server_pid(folder), watcher_pid(folder)):
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGTERM)
            wait_gone(pid)
    assert server_pid(folder) is None or not alive(server_pid(folder))


def server_pid(folder: Path) -> int | None:
    files = list(folder.glob("spark-local-connect-*.pid"))
    return int(files[0].read_text()) if files else None


def watcher_pid(folder: Path) -> int | None:
    text = (folder / "singerlake-watcher.lock").read_text().split() if (folder / "singerlake-watcher.lock").exists() else []
    return int(text[1]) if len(text) == 2 else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + HANG_S
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not alive(pid)


def singerlake(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "singerlake"), *args], capture_output=True, text=True, env=env, timeout=HANG_S)


def start(env: dict) -> int:
    """Start the warm server with its UI on, for Spark's own job list; its UI port."""
    ui = free_port()
    args = ["--spark-conf", "spark.ui.enabled=true", "--spark-conf", f"spark.ui.port={ui}"]
    args += ["--spark-conf", f"spark.local.connect.server.port={free_port()}"]
    started = singerlake(env, "spark", "start", *args)
    assert started.returncode == 0, started.stderr
    return ui


def spark_jobs(ui: int) -> int:
    """How many jobs the server's Spark has run, from its REST API."""
    base = f"http://127.0.0.1:{ui}/api/v1/applications"
    (app,) = json.load(urllib.request.urlopen(base, timeout=30))
    return len(json.load(urllib.request.urlopen(f"{base}/{app['id']}/jobs", timeout=30)))


def session_run(env: dict) -> int:
    """A process that opens a session on the warm server and exits: how many files it shipped."""
    run = subprocess.run([sys.executable, "-c", SESSION], capture_output=True, text=True, env=env, timeout=HANG_S)
    assert run.returncode == 0, run.stderr
    return int(run.stdout.split()[-1])


def singer_input(records: int) -> bytes:
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
    lines = [{"type": "SCHEMA", "stream": "users", "key_properties": ["id"], "schema": schema}]
    lines += [{"type": "RECORD", "stream": "users", "record": {"id": i, "name": f"user {i}"}} for i in range(records)]
    lines.append({"type": "STATE", "value": {"position": records}})
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def land(env: dict, tmp_path: Path, spark_conf: dict | None = None, records: int = 10, **settings) -> subprocess.CompletedProcess:
    config = tmp_path / "target.json"
    config.write_text(json.dumps({"tap_id": "tap-warm", "lake_root": str(tmp_path / "lake"), "spark_conf": spark_conf or {}, **settings}))
    return subprocess.run(
        [str(BIN / "target-singerlake"), "--config", str(config)], input=singer_input(records), capture_output=True, env=env, timeout=HANG_S
    )


def landed_records(env: dict, tmp_path: Path) -> int:
    listed = singerlake(env, "ls", str(tmp_path / "lake"), "--json")
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)["taps"]["tap-warm"]["users"]["records"]


def test_a_second_session_on_the_server_ships_nothing_and_runs_no_check_job(warm):
    ui = start(warm)
    before = spark_jobs(ui)
    assert session_run(warm) == 1  # the first session of this core: shipped once, to the server's template
    after_first = spark_jobs(ui)
    assert after_first > before  # and its executors checked
    assert session_run(warm) == 0
    assert spark_jobs(ui) == after_first


def test_start_status_a_landing_on_it_and_stop(warm, tmp_path):
    ui = start(warm)
    status = singerlake(warm, "spark", "status", "--json")
    assert status.returncode == 0, status.stderr
    state = json.loads(status.stdout)
    assert state["running"] and state["pid"] == server_pid(tmp_path / "warm") and state["rss_mib"] > 0
    assert "token" not in status.stdout
    jobs = spark_jobs(ui)

    landed = land(warm, tmp_path)
    assert landed.returncode == 0, landed.stderr.decode()
    assert "in this process" in landed.stderr.decode() and spark_jobs(ui) == jobs, "its input ended before Spark began: none ran"
    assert landed_records(warm, tmp_path) == 10
    landed = land(warm, tmp_path, records=30, batch_max_rows=10)  # batches cut before the input ends
    assert landed.returncode == 0, landed.stderr.decode()
    assert spark_jobs(ui) > jobs  # the landing's jobs ran on the warm server
    assert landed_records(warm, tmp_path) == 40

    stopped = singerlake(warm, "spark", "stop")
    assert stopped.returncode == 0 and f"pid {state['pid']}" in stopped.stdout
    assert not alive(state["pid"])
    assert singerlake(warm, "spark", "status").returncode == 1


def test_an_idle_server_stops_itself(warm, tmp_path):
    env = {**warm, "SINGERLAKE_SPARK_IDLE_MINUTES": "0.25"}  # 15 s
    start(env)
    pid = server_pid(tmp_path / "warm")
    assert "stops after 0.25 min idle" in singerlake(env, "spark", "status").stdout
    assert wait_gone(pid)
    assert singerlake(env, "spark", "status").stdout.strip() == "warm Spark: not running"


def test_a_server_that_cannot_start_leaves_one_line_and_the_run_lands_on_local_spark(warm, tmp_path):
    # A setting only a Connect server reads, which kills it at start-up; a local Spark ignores it.
    landed = land(warm, tmp_path, {"spark.connect.grpc.interceptor.classes": "no.such.Interceptor"})
    assert landed.returncode == 0, landed.stderr.decode()
    stderr = landed.stderr.decode()
    lines = [line for line in stderr.splitlines() if "warm Spark" in line]
    assert len(lines) == 1 and "this run starts a local Spark of its own" in lines[0], stderr
    assert "Traceback" not in stderr
    assert landed_records(warm, tmp_path) == 10
    assert singerlake(warm, "spark", "status").returncode == 1


def test_a_bad_warm_setting_is_one_line_and_exit_2(warm, tmp_path):
    refused = land({**warm, "SINGERLAKE_SPARK_WARM": "perhaps"}, tmp_path)
    assert refused.returncode == 2
    stderr = refused.stderr.decode()
    errors = [line for line in stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert errors == ["target-singerlake: error: $SINGERLAKE_SPARK_WARM: expected true or false, got 'perhaps'"], stderr
