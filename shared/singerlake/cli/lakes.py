"""The lake and the Spark session of a ``singerlake`` command, from its options: the lake root with its
``--s3-*`` options, and where its Spark jobs run (``spark.placement`` says whether they reach the lake)."""

from __future__ import annotations

import argparse
import importlib.util

from singerlake.errors import ConfigError
from singerlake.lake import Lake
from singerlake.settings import storage_options
from singerlake.spark import placement


def lake_options(args: argparse.Namespace) -> dict:
    """The storage options of the command line's ``--s3-*`` options, else of ``$SINGERLAKE_S3_*`` (the keys only
    from there: no secret on a command line), the names Meltano gives the ``singerlake`` utility's settings."""
    return storage_options(vars(args))


def open_lake(args: argparse.Namespace, files: bool = False) -> Lake:
    """The lake of a lake job: it must hold landed data (raw/); with ``files``, pushed files (files/) will do too."""
    if files:
        lake = open_files_lake(args)
    else:
        lake = Lake.open(args.root, **lake_options(args))
        lake.check_is_lake()
    if getattr(args, "spark_conf", None) is not None:  # a command that runs Spark jobs
        check_lake_reachable(args, lake)
    return lake


def open_files_lake(args: argparse.Namespace) -> Lake:
    """A lake to query or fetch files from: it must exist and hold files or landed data."""
    lake = Lake.open(args.root, **lake_options(args))
    lake.check_exists()
    if not {"files", "raw"} & set(lake.storage.list_dirs("")):
        raise ConfigError(f"lake root {args.root} holds no lake: it has neither files/ nor raw/")
    return lake


def check_lake_reachable(args: argparse.Namespace, lake: Lake) -> None:
    """A lake on this machine's disk cannot be worked on by executors elsewhere, unless it is shared."""
    placement.check_lake_reachable(
        lake.storage, args.root, shared=args.lake_root_shared, master=args.spark_master, remote=args.spark_remote
    )


def check_spark_installed(args: argparse.Namespace) -> dict:
    """The ``--spark-conf`` settings, once Spark is known to be installed."""
    if importlib.util.find_spec("pyspark") is None:  # the core alone (a tap's install) has no Spark
        hint = ", or add --no-hashes" if hasattr(args, "no_hashes") else ""
        raise ConfigError(f"singerlake {args.command} runs on Spark, which is not installed: pip install 'singerlake[spark]'{hint}")
    return placement.conf_of_options(args.spark_conf)


def start_spark(args: argparse.Namespace):
    from singerlake.spark.session import spark_session

    conf = check_spark_installed(args)
    return spark_session(master=args.spark_master, remote=args.spark_remote, conf=conf, app_name=f"singerlake {args.command}")


def start_push_spark(args: argparse.Namespace, lake: Lake):
    """The session a push runs on, once the executors are known to reach the lake and the pushed files."""
    check_lake_reachable(args, lake)
    placement.check_files_reachable(shared=args.source_shared, master=args.spark_master, remote=args.spark_remote)
    return start_spark(args)
