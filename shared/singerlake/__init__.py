"""Singerlake: a raw landing zone for Singer data on object storage (format: ``SPEC.md``).

The stable Python API is what this module exports; everything in the subpackages may move::

    import singerlake

    lake = singerlake.Lake.open("s3://bucket/lake", endpoint_url="http://127.0.0.1:9000")
    for tap_id in lake.taps():
        for stream in lake.streams(tap_id):
            manifest = lake.manifest(tap_id, stream)  # read from its metadata, or rebuilt by a scan

    spark = singerlake.spark_session("local[*]")
    problems = singerlake.verify(lake, spark)          # also: repair, compact, project, vacuum, upgrade
    singerlake.register_datasource(spark)              # spark.read.format("singerlake") and "singerlake-files"

The subpackages, from the bottom up: ``storage`` (local and S3 objects), ``format`` (names, layout,
schema hash, data files, manifests, catalogues, record positions), ``commits`` (locks and fenced
commits), ``landing`` (the target's reader, batches and drain), ``replay`` (the tap's reader and the
Spark data source), ``spark`` (sessions and executors), ``jobs`` (the lake jobs) and ``cli``.
Spark-backed names are imported on first use, so ``import singerlake`` stays light.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

from singerlake.errors import ConfigError, SingerlakeError
from singerlake.format.manifest import SPEC_VERSION, Manifest
from singerlake.format.schema_hash import schema_hash
from singerlake.lake import Lake, LakeNotFound, UnknownTap
from singerlake.landing.writer import SchemaWriter
from singerlake.storage import Storage, open_storage

try:
    __version__ = importlib.metadata.version("singerlake")  # the installed release: the repository's VERSION
except importlib.metadata.PackageNotFoundError:
    __version__ = "0+unknown"  # the package folder on sys.path, never installed

_LAZY = {
    "spark_session": "singerlake.spark.session",
    "register_datasource": ("singerlake.sources", "register"),
    "verify": "singerlake.jobs.verify",
    "repair": "singerlake.jobs.repair",
    "compact": "singerlake.jobs.compact",
    "project": "singerlake.tables.project",
    "vacuum": "singerlake.jobs.vacuum",
    "upgrade": "singerlake.jobs.upgrade",
}

__all__ = [
    "ConfigError",
    "Lake",
    "LakeNotFound",
    "Manifest",
    "SPEC_VERSION",
    "SchemaWriter",
    "SingerlakeError",
    "Storage",
    "UnknownTap",
    "open_storage",
    "schema_hash",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'singerlake' has no attribute {name!r}")
    module, attr = _LAZY[name] if isinstance(_LAZY[name], tuple) else (_LAZY[name], name)
    return getattr(importlib.import_module(module), attr)
