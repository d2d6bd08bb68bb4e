"""Shared fixtures: a real moto S3 server on 127.0.0.1 and lake roots on both backends."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from lakes import LakeUnderTest, local_lake_at, s3_lake_at
from singerlake.storage import LocalStorage, S3Storage

S3_KEYS = {"access_key_id": "testing", "secret_access_key": "testing-secret", "region": "us-east-1"}


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "heavy: starts clusters or many processes; runs in CI, skip while iterating with -m 'not heavy'")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    """A moto S3 server over real HTTP on loopback, for the whole test session."""
    port = _free_port()
    server = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    assert server, "moto_server not installed: pip install 'moto[server]>=5.2.5'"
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"moto server did not start; log:\n{log.read_text()}")
            time.sleep(0.1)
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    yield endpoint
    proc.terminate()
    proc.wait(timeout=10)


def s3_options(endpoint: str) -> dict:
    return {**S3_KEYS, "endpoint_url": endpoint}


@pytest.fixture
def s3_root(moto_endpoint):
    """A fresh bucket; returns (url, options) for open_storage."""
    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    storage = S3Storage(f"s3://{bucket}", **s3_options(moto_endpoint))
    storage.client.create_bucket(Bucket=bucket)
    return f"s3://{bucket}/some/prefix", s3_options(moto_endpoint)


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    """The same test over a temp dir and over moto's HTTP S3."""
    if request.param == "local":
        return LocalStorage(tmp_path / "lake")
    url, options = request.getfixturevalue("s3_root")
    return S3Storage(url, **options)


@pytest.fixture(params=["local", "s3"])
def lake_spec(request, tmp_path) -> dict:
    """A lake root as plain data (so child processes can open it too): {"url", "options"}."""
    if request.param == "local":
        return {"url": str(tmp_path / "lake"), "options": {}}
    url, options = request.getfixturevalue("s3_root")
    return {"url": url, "options": options}


@pytest.fixture(params=["local", "s3"])
def lake(request, tmp_path) -> LakeUnderTest:
    if request.param == "local":
        return local_lake_at(tmp_path)
    return s3_lake_at(request.getfixturevalue("s3_root"))


@pytest.fixture
def local_lake(tmp_path) -> LakeUnderTest:
    return local_lake_at(tmp_path)
