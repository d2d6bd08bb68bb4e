"""The ``singerlake`` command on a lake under test: one process per command (``run_cli``), or every command
of a lake in one CliSession (``LakeCli``: one Spark start for them all)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from singerlake import Lake
from singerlake.storage import S3Storage

from support.cli_session import CliSession
from support.lakes import LakeUnderTest
from support.s3_servers import S3_KEYS

CLI = shutil.which("singerlake", path=str(Path(sys.executable).parent)) or "singerlake"
SPARK_COMMANDS = {"verify", "repair", "compact", "project", "sql", "docs"}


def open_lake(lake: LakeUnderTest) -> Lake:
    return Lake(lake.storage)


def cli_args(lake: LakeUnderTest, *args: str, master: str = "local[2]") -> tuple[list[str], dict]:
    """The CLI's arguments (after ``singerlake``) for ``args`` on ``lake``, and the environment to run it in."""
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}
    extra = []
    if isinstance(lake.storage, S3Storage):
        options = lake.storage.open_options()
        env.update(AWS_ACCESS_KEY_ID=options["access_key_id"], AWS_SECRET_ACCESS_KEY=options["secret_access_key"])
        extra = ["--s3-endpoint-url", options["endpoint_url"], "--s3-region", options["region"]]
    spark = ["--spark-master", master] if args[0] in SPARK_COMMANDS else []  # the others take no Spark options
    return [args[0], lake.config["lake_root"], *extra, *spark, *args[1:]], env


def run_cli(lake: LakeUnderTest, *args: str, master: str = "local[2]") -> subprocess.CompletedProcess:
    argv, env = cli_args(lake, *args, master=master)
    return subprocess.run([CLI, *argv], capture_output=True, text=True, timeout=600, env=env)


class LakeCli:
    """``run`` is ``run_cli`` on one lake, every command in one CliSession (one Spark start for them all)."""

    def __init__(self, session: CliSession, lake: LakeUnderTest, master: str):
        self.session, self.lake, self.master = session, lake, master

    def run(self, *args: str) -> subprocess.CompletedProcess:
        argv, _ = cli_args(self.lake, *args, master=self.master)
        return self.session.run(*argv)


def cli_env() -> dict:
    """``run_cli``'s environment for any lake of these tests: every S3 server takes the same keys."""
    keys = {"AWS_ACCESS_KEY_ID": S3_KEYS["access_key_id"], "AWS_SECRET_ACCESS_KEY": S3_KEYS["secret_access_key"]}
    return {**os.environ, "AWS_EC2_METADATA_DISABLED": "true", **keys}
