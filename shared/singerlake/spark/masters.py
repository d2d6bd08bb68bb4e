"""Where Spark runs: a local master (executors share this machine's disk and Python), a cluster, or
Spark Connect (``sc://``)."""

from __future__ import annotations

import os

from singerlake.errors import ConfigError


def is_local_master(master: str) -> bool:
    """local, local[N], local-cluster[...]: executors on this machine, sharing its disk and Python."""
    return is_in_process_master(master) or master.startswith("local-cluster[")


def is_in_process_master(master: str) -> bool:
    """local, local[N]: executors are threads of the driver's own JVM (local-cluster's are processes of their own)."""
    return master == "local" or master.startswith("local[")


def resolve_master(master: str | None, remote: str | None) -> tuple[str, str | None]:
    """(master, remote): an ``sc://`` master is a remote; ``$SPARK_REMOTE`` applies when neither is given."""
    if master and master.startswith("sc://"):
        if remote and remote != master:
            raise ConfigError(f"two Spark Connect servers given: master {master!r} and remote {remote!r}")
        return "local[*]", master
    remote = remote or (None if master else os.environ.get("SPARK_REMOTE"))
    if master and remote and master != "local[*]":
        raise ConfigError(f"both a Spark master ({master!r}) and a Spark Connect remote ({remote!r}) are set: choose one")
    return master or "local[*]", remote


def is_connect(session) -> bool:
    """Whether ``session`` is a Spark Connect client's (no SparkContext, no job groups, no status tracker)."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def runs_on_this_machine(master: str | None, remote: str | None = None) -> bool:
    """Whether every executor shares this machine's disk (a local master, not Spark Connect)."""
    master, remote = resolve_master(master, remote)
    return remote is None and is_local_master(master)
