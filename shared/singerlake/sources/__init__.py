"""The Spark data sources: ``format("singerlake")`` (a lake stream, batch and streaming) and
``format("singerlake-files")`` (the index of pushed files)."""

from __future__ import annotations

from singerlake.sources.files import FilesDataSource
from singerlake.sources.stream import SingerlakeDataSource
from singerlake.spark.executors import prepare_executors


def register(spark) -> None:
    """Make both formats available on ``spark``; a cluster's executors get the core shipped."""
    prepare_executors(spark)
    spark.dataSource.register(SingerlakeDataSource)
    spark.dataSource.register(FilesDataSource)
