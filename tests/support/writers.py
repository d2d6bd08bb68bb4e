"""Writers as real CLI processes, held at a named step while vacuum runs (SPEC.md §15): the tools of
the vacuum race tests. ``SINGERLAKE_PAUSE_AT`` makes a process stop itself (SIGSTOP) at that step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from singerlake.commits.lock import LockInfo
from singerlake.lake import Lake
from singerlake.times import iso_ms, now_ms

from support.lakes import CLI as TARGET_CLI
from support.lakes import LakeUnderTest
from support.processes import process_state

HANG_S = 300  # hang detector, not a speed limit
SINGERLAKE = [sys.executable, "-m", "singerlake.cli"]
TAP_CLI = str(Path(sys.executable).with_name("tap-singerlake"))
LONG_AGO_MS = 10 * 86_400_000


def cli_env(lake: LakeUnderTest, **extra: str) -> dict:
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true", **extra}
    env.pop("SINGERLAKE_PAUSE_AT", None)
    if "s3_access_key_id" in lake.config:
        env.update(AWS_ACCESS_KEY_ID=lake.config["s3_access_key_id"], AWS_SECRET_ACCESS_KEY=lake.config["s3_secret_access_key"])
    return {**env, **extra}


def singerlake(lake: LakeUnderTest, command: str, *args: str) -> list[str]:
    """The argv of ``singerlake COMMAND ROOT [S3 options] ARGS``."""
    s3 = []
    if "s3_endpoint_url" in lake.config:
        s3 = ["--s3-endpoint-url", lake.config["s3_endpoint_url"], "--s3-region", lake.config["s3_region"]]
    return [*SINGERLAKE, command, lake.config["lake_root"], *s3, *args]


def run(lake: LakeUnderTest, command: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(singerlake(lake, command, *args), capture_output=True, text=True, env=cli_env(lake), timeout=HANG_S)


def vacuum_now(lake: LakeUnderTest, *args: str) -> subprocess.CompletedProcess:
    done = run(lake, "vacuum", "--retention", "0s", "--force", "--apply", *args)
    assert done.returncode == 0, done.stderr
    return done


class Held:
    """A real process stopped at a pause point while the test acts, then let go (SIGCONT)."""

    def __init__(self, command: list[str], point: str, env: dict, stdin: bytes | None = None):
        self.point = point
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**env, "SINGERLAKE_PAUSE_AT": point},
        )
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.paused = threading.Event()
        self.threads = [threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True)]
        self.threads.append(threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True))
        if stdin is not None:
            self.threads.append(threading.Thread(target=self._feed, args=(stdin,), daemon=True))
        for thread in self.threads:
            thread.start()

    def _read(self, stream, lines: list[bytes]) -> None:
        for line in stream:
            lines.append(line)
            if f"paused at {self.point}".encode() in line:
                self.paused.set()

    def _feed(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # the process ended early: its exit code tells

    def wait_paused(self) -> Held:
        if not self.paused.wait(HANG_S):
            self.proc.kill()
            pytest.fail(f"never reached {self.point}; stderr:\n{b''.join(self.err).decode()[-3000:]}")
        while process_state(self.proc.pid) != "T":  # the line is printed just before the SIGSTOP
            time.sleep(0.01)
        return self

    def release(self) -> subprocess.CompletedProcess:
        os.kill(self.proc.pid, signal.SIGCONT)
        return self.finish()

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.finish()

    def finish(self) -> subprocess.CompletedProcess:
        self.proc.wait(HANG_S)
        for thread in self.threads:
            thread.join(HANG_S)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, b"".join(self.out), b"".join(self.err))


def make_stale(lake: LakeUnderTest, key: str, ago_ms: int = 3_600_000) -> None:
    """Rewrite a lock or lease as its holder would have left it ``ago_ms`` ago: how it reads once its
    holder stalled (or died) for that long."""
    info = LockInfo.parse(lake.read(key))
    then = iso_ms(now_ms() - ago_ms)
    body = {"writer-id": info.writer_id, "acquired": then, "refreshed": then, "lease_seconds": info.lease_s}
    lake.storage.write(key, json.dumps(body).encode())


# -- pushes ----------------------------------------------------------------------------------------
def files_to_push(tmp_path: Path) -> dict[str, bytes]:
    """A large file (streamed in parts) and a small one (read whole)."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    files = {"big.bin": os.urandom(6 << 20), "small.txt": b"a small file\n" * 100}
    for name, data in files.items():
        (src / name).write_bytes(data)
    return files


PUSH_ARGS = ["--what", "app-log", "--where", "web01", "--start", "2026-11-20T10:00:00Z", "--json"]


def push(lake: LakeUnderTest, tmp_path: Path, point: str) -> Held:
    return Held(singerlake(lake, "push", str(tmp_path / "src"), *PUSH_ARGS), point, cli_env(lake)).wait_paused()


def check_pushed(lake: LakeUnderTest, tmp_path: Path, done: subprocess.CompletedProcess, files: dict[str, bytes]) -> None:
    """The push acknowledged every file once, and each reads back."""
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    assert sorted(Path(r["path"]).name for r in result["pushed"] + result["duplicates"]) == sorted(files)
    check_readable(lake, tmp_path, files)


def check_readable(lake: LakeUnderTest, tmp_path: Path, files: dict[str, bytes]) -> None:
    """Each file is found by its day and fetched byte for byte, and verify is clean."""
    found = {r["name"]: r["id"] for r in Lake(lake.storage).find_files("app-log", start="2026-11-20", end="2026-11-21")}
    assert sorted(found) == sorted(files), "every acknowledged file is found by its day"
    out = tmp_path / f"fetched-{time.monotonic_ns()}"
    fetched = run(lake, "fetch", *found.values(), "--out", str(out), "--name", "{name}")
    assert fetched.returncode == 0, fetched.stderr
    for name, data in files.items():
        assert (out / name).read_bytes() == data, f"{name} comes back byte for byte"
    verify = run(lake, "verify", "--no-hashes")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def pending_leases(lake: LakeUnderTest) -> list[str]:
    return lake.keys("files/index/app-log/pending/")  # SPEC.md §15


# -- landing ---------------------------------------------------------------------------------------
RECORDS, STATE_EVERY, BATCH_ROWS = 30_000, 5_000, 10_000
USERS = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}


def landing_input(first: int = 1, last: int = RECORDS) -> bytes:
    """SCHEMA, then records ``first``..``last`` with a STATE after every STATE_EVERY."""
    lines = [json.dumps({"type": "SCHEMA", "stream": "users", "schema": USERS, "key_properties": ["id"]}).encode()]
    for i in range(first, last + 1):
        lines.append(json.dumps({"type": "RECORD", "stream": "users", "record": {"id": i, "name": f"user {i}"}}).encode())
        if i % STATE_EVERY == 0:
            lines.append(json.dumps({"type": "STATE", "value": {"upto": i}}).encode())
    return b"\n".join(lines) + b"\n"


def land(lake: LakeUnderTest, tmp_path: Path, data: bytes) -> None:
    done = subprocess.run(target_command(lake, tmp_path), input=data, capture_output=True, env=cli_env(lake), timeout=HANG_S)
    assert done.returncode == 0, done.stderr.decode()[-3000:]


def target_command(lake: LakeUnderTest, tmp_path: Path, name: str = "target", **settings) -> list[str]:
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps({**lake.config, "batch_max_rows": BATCH_ROWS, "spark_master": "local[2]", **settings}))
    return [TARGET_CLI, "--config", str(config)]


def replayed(lake: LakeUnderTest, tmp_path: Path) -> list[bytes]:
    """The RECORD messages tap-singerlake replays, as their records' JSON."""
    config = tmp_path / "tap.json"
    config.write_text(json.dumps(lake.config))
    done = subprocess.run([TAP_CLI, "--config", str(config)], capture_output=True, env=cli_env(lake), timeout=HANG_S)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return [json.loads(line)["record"] for line in done.stdout.splitlines() if json.loads(line)["type"] == "RECORD"]


def states(out: bytes) -> list[int]:
    """The STATE values a target emitted (a target writes each value alone on a line)."""
    return [json.loads(line)["upto"] for line in out.splitlines() if line.strip()]
