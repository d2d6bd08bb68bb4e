"""Shared fixtures: real S3 servers on 127.0.0.1 (moto and SeaweedFS) and lake roots on every backend."""

from __future__ import annotations

import os
import uuid

import pytest
from lakes import LakeUnderTest, local_lake_at, s3_lake_at
from s3_servers import S3_KEYS as S3_KEYS  # re-exported: test_spark_clusters imports it from here
from s3_servers import S3Server, free_port, start_moto, start_seaweedfs
from singerlake.storage import LocalStorage, S3Storage

S3_SERVERS = ("moto", "seaweedfs")
BACKENDS = ("local", *S3_SERVERS)  # the ids of every test that runs on each backend
_free_port = free_port  # test_spark_clusters imports it from here


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "heavy: starts clusters or many processes; runs in CI, skip while iterating with -m 'not heavy'")


def _serve(start, tmp_path_factory, name: str):
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    server = start(tmp_path_factory.mktemp(name))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory):
    """moto's S3 over real HTTP on loopback, one process for the whole test session."""
    yield from _serve(start_moto, tmp_path_factory, "moto")


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory):
    """SeaweedFS's S3 gateway on loopback, one process for the whole test session."""
    yield from _serve(start_seaweedfs, tmp_path_factory, "seaweedfs")


@pytest.fixture(params=S3_SERVERS)
def s3_server(request) -> S3Server:
    """The same test on each S3 server."""
    return request.getfixturevalue(f"{request.param}_server")


def _new_bucket(request, server: S3Server) -> tuple[str, dict]:
    """A fresh bucket on ``server`` for this test; returns (url, options) for open_storage."""
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
        print(f"conftest: could not drop moto bucket {bucket}: {exc}")


@pytest.fixture
def s3_root(request, s3_server):
    """A fresh bucket on each S3 server; returns (url, options) for open_storage."""
    return _new_bucket(request, s3_server)


def _s3_root_on(request) -> tuple[str, dict]:
    return _new_bucket(request, request.getfixturevalue(f"{request.param}_server"))


@pytest.fixture(params=BACKENDS)
def storage(request, tmp_path):
    """The same test over a temp dir and over each S3 server."""
    if request.param == "local":
        return LocalStorage(tmp_path / "lake")
    url, options = _s3_root_on(request)
    return S3Storage(url, **options)


@pytest.fixture(params=BACKENDS)
def lake_spec(request, tmp_path) -> dict:
    """A lake root as plain data (so child processes can open it too): {"url", "options"}."""
    if request.param == "local":
        return {"url": str(tmp_path / "lake"), "options": {}}
    url, options = _s3_root_on(request)
    return {"url": url, "options": options}


@pytest.fixture(params=BACKENDS)
def lake(request, tmp_path) -> LakeUnderTest:
    if request.param == "local":
        return local_lake_at(tmp_path)
    return s3_lake_at(_s3_root_on(request))


@pytest.fixture(params=["local", "seaweedfs"])
def cli_lake(request, tmp_path) -> LakeUnderTest:
    """A lake on local disk and one on SeaweedFS: for tests of real processes, too slow to run on every backend."""
    if request.param == "local":
        return local_lake_at(tmp_path)
    return s3_lake_at(_new_bucket(request, request.getfixturevalue("seaweedfs_server")))


@pytest.fixture
def local_lake(tmp_path) -> LakeUnderTest:
    return local_lake_at(tmp_path)
