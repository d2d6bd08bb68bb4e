"""Starting Spark for lake jobs: Java checked first, loopback-only networking, user conf last."""

from __future__ import annotations

import os
from typing import Any

from singerlake.java import ensure_java

# Keep the driver and executors on loopback unless the user says otherwise in spark_conf.
LOCAL_DEFAULTS = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
}


def spark_session(
    master: str = "local[*]",
    app_name: str = "singerlake",
    conf: dict[str, Any] | None = None,
    remote: str | None = None,
):
    """A SparkSession for ``master`` (or a Spark Connect ``remote``), with ``conf`` applied last."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if remote:
        builder = builder.remote(remote)
    else:
        ensure_java()
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.master(master)
        for key, value in LOCAL_DEFAULTS.items():
            builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, str(value))
    session = builder.getOrCreate()
    if not remote:
        session.sparkContext.setLogLevel("ERROR")
    return session
