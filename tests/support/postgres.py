"""A throwaway PostgreSQL server for tests: Debian's postgresql, started on 127.0.0.1 with its own data
directory and stopped by the test (``postgres`` fixture)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from support.s3_servers import free_port


def postgres_bin() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(candidates[-1]).parent if candidates else None


class Postgres:
    """A throwaway server on 127.0.0.1 with its own data directory (as user postgres when run as root:
    PostgreSQL refuses to run as root)."""

    def __init__(self, bindir: Path):
        self.bindir, self.port = bindir, free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="singerlake-pg-"))
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres")

    def run(self, tool: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
        done = subprocess.run([*self.as_user, str(self.bindir / tool), *args], capture_output=True, text=True, timeout=300, **kwargs)
        assert done.returncode == 0, f"{tool} failed: {done.stderr[-2000:]}"
        return done

    def start(self) -> None:
        data = self.dir / "data"
        self.run("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale")
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir}"
        self.run("pg_ctl", "-D", str(data), "-o", options, "-l", str(self.dir / "log"), "-w", "start")

    def psql(self, sql: str) -> str:
        return self.run("psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-At", "-v", "ON_ERROR_STOP=1", input=sql).stdout

    def stop(self) -> None:
        stop = [*self.as_user, str(self.bindir / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "stop"]
        subprocess.run(stop, capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def postgres():
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed: ./dev installs Debian's postgresql package when run as root with apt-get")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: PostgreSQL refuses to run as root")
    server = Postgres(bindir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
