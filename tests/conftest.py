"""Shared fixtures: real S3 servers on 127.0.0.1 (moto and SeaweedFS), lake roots on every backend, the test
process's SparkSession and CLI sessions. The tools behind them, and every other shared tool, are in support/."""

from __future__ import annotations

import os

import pytest
from singerlake.storage import LocalStorage, S3Storage
from support.browser import browser  # noqa: F401 (a fixture: headless Chromium for every test module)
from support.cli_session import CliSession
from support.lake_cli import LakeCli, cli_env
from support.lakes import LakeUnderTest, local_lake_at, s3_lake_at
from support.postgres import postgres  # noqa: F401 (a fixture: a PostgreSQL server of its own)
from support.s3_counter import CountedRoot, counted_root
from support.s3_servers import BACKENDS, S3_SERVERS, S3Server, new_bucket, s3_root_on, start_moto, start_seaweedfs


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "heavy: starts clusters or many processes; runs in CI, skip while iterating with -m 'not heavy'")


@pytest.fixture(scope="session", autouse=True)
def _proven_roots(tmp_path_factory):
    """The S3 roots runs proved writable (SPEC.md §10) are remembered in the session's own cache, not the user's."""
    os.environ["SINGERLAKE_CACHE_DIR"] = str(tmp_path_factory.mktemp("singerlake-cache"))


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


@pytest.fixture
def s3_root(request, s3_server):
    """A fresh bucket on each S3 server; returns (url, options) for open_storage."""
    return new_bucket(request, s3_server)


@pytest.fixture(params=S3_SERVERS)
def counted_s3_root(request) -> CountedRoot:
    """A fresh bucket on each S3 server behind a counting proxy (support/s3_counter.py): ``url, options = root``
    as ``s3_root`` (``options["endpoint_url"]`` the proxy's), and ``root.counter``, which counts every request."""
    return counted_root(request, request.getfixturevalue(f"{request.param}_server"))


@pytest.fixture(params=BACKENDS)
def storage(request, tmp_path):
    """The same test over a temp dir and over each S3 server."""
    if request.param == "local":
        return LocalStorage(tmp_path / "lake")
    url, options = s3_root_on(request)
    return S3Storage(url, **options)


@pytest.fixture(params=BACKENDS)
def lake_spec(request, tmp_path) -> dict:
    """A lake root as plain data (so child processes can open it too): {"url", "options"}."""
    if request.param == "local":
        return {"url": str(tmp_path / "lake"), "options": {}}
    url, options = s3_root_on(request)
    return {"url": url, "options": options}


@pytest.fixture(params=BACKENDS)
def lake(request, tmp_path) -> LakeUnderTest:
    if request.param == "local":
        return local_lake_at(tmp_path)
    return s3_lake_at(s3_root_on(request))


@pytest.fixture(params=["local", "seaweedfs"])
def cli_lake(request, tmp_path) -> LakeUnderTest:
    """A lake on local disk and one on SeaweedFS: for tests of real processes, too slow to run on every backend."""
    if request.param == "local":
        return local_lake_at(tmp_path)
    return s3_lake_at(new_bucket(request, request.getfixturevalue("seaweedfs_server")))


@pytest.fixture
def local_lake(tmp_path) -> LakeUnderTest:
    return local_lake_at(tmp_path)


# -- Spark and the CLI --------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def spark():
    """The test process's SparkSession (local[*]): one JVM for every in-process job of the session. Modules that
    need a session of their own settings define their own ``spark`` fixture (``spark_session`` finds this one)."""
    from singerlake.spark.session import spark_session

    return spark_session("local[*]", "singerlake-tests")


@pytest.fixture(scope="module")
def shared_cli():
    """One CliSession for the module's local[2] commands, whatever their lake: one Spark start for them all."""
    with CliSession(cli_env()) as session:
        yield session


@pytest.fixture
def cli_session(shared_cli):
    """``cli_session(lake, master=...)``: a LakeCli; on local[2] the module's session, else its own (ended after the test)."""
    own: list[CliSession] = []

    def start(lake: LakeUnderTest, master: str = "local[2]") -> LakeCli:
        if master == "local[2]":
            return LakeCli(shared_cli, lake, master)
        own.append(CliSession(cli_env()))  # another master needs a Spark session of its own
        return LakeCli(own[-1], lake, master)

    yield start
    for session in own:
        session.close()
