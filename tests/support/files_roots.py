"""Lake roots of the files tests (SPEC.md §14) on every backend, for the API and for the ``singerlake`` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from singerlake.lake import Lake
from singerlake.storage import open_storage

from support.cli_session import CliSession
from support.s3_servers import new_bucket

BASE = int(datetime(2024, 3, 1, tzinfo=timezone.utc).timestamp() * 1000)  # a midnight, UTC


@dataclass
class Root:
    kind: str
    url: str
    options: dict = field(default_factory=dict)
    session: CliSession | None = None  # set: ``cli`` runs its commands there, not one process each

    @property
    def storage(self):
        return open_storage(self.url, **self.options)

    @property
    def lake(self) -> Lake:
        return Lake(self.storage)

    def under(self, name: str) -> Root:
        """Another, empty root beside this one (one per hypothesis example)."""
        return Root(self.kind, f"{self.url.rstrip('/')}/{name}", self.options)

    def keys(self, prefix: str = "files/") -> list[str]:
        return [info.key for info in self.storage.list(prefix)]

    def segments(self) -> list[str]:
        # Segments live under files/index/<what>/segments/ (layout.segment_key): listing only the index,
        # not every data file and record too, keeps the kill test's 20 ms polling off the S3 server.
        return [key for key in self.keys("files/index/") if "/segments/" in key]

    def cli(self, command: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}
        extra: list[str] = []
        if self.options:
            env.update(AWS_ACCESS_KEY_ID=self.options["access_key_id"], AWS_SECRET_ACCESS_KEY=self.options["secret_access_key"])
            extra = ["--s3-endpoint-url", self.options["endpoint_url"], "--s3-region", self.options["region"]]
        if self.session is None:
            result = subprocess.run(self.command(command, *extra, *args), capture_output=True, env=env)
        else:
            argv = self.command(command, *extra, *args)[3:]  # after: python -m singerlake.cli
            ran = self.session.run(*argv)
            result = subprocess.CompletedProcess(ran.args, ran.returncode, ran.stdout.encode(), ran.stderr.encode())
        if check:
            assert result.returncode == 0, f"singerlake {command} {args}: exit {result.returncode}\n{result.stderr.decode()}"
        return result

    def command(self, command: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "singerlake.cli", command, self.url, *args]

    def cli_session(self) -> CliSession:
        """A CliSession in the environment ``cli`` gives each command; ``cli`` uses it while it is set."""
        env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}
        if self.options:
            env.update(AWS_ACCESS_KEY_ID=self.options["access_key_id"], AWS_SECRET_ACCESS_KEY=self.options["secret_access_key"])
        self.session = CliSession(env)
        return self.session

    def cli_json(self, command: str, *args: str):
        return json.loads(self.cli(command, *args, "--json").stdout)


def root_on(request, kind: str, tmp_path: Path) -> Root:
    if kind == "local":
        return Root("local", str(tmp_path / "lake"))
    url, options = new_bucket(request, request.getfixturevalue(f"{kind}_server"))
    return Root(kind, url, options)


def assert_refused(root: Root, result: subprocess.CompletedProcess, named: str) -> None:
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert len(err.strip().splitlines()) == 1 and named in err, err
    assert result.stdout == b""
    assert root.segments() == [] and root.keys() == [], "nothing under files/"


def cli_s3_args(root: Root) -> list[str]:
    return ["--s3-endpoint-url", root.options["endpoint_url"], "--s3-region", root.options["region"]]


def cli_env(root: Root) -> dict:
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}
    if root.options:
        env.update(AWS_ACCESS_KEY_ID=root.options["access_key_id"], AWS_SECRET_ACCESS_KEY=root.options["secret_access_key"])
    return env
