"""Executors of someone else's cluster: ship them the core, then check they can run it.

A cluster's executors (standalone, k8s, yarn, Spark Connect) run whatever Python the cluster has.
The pure-Python ``singerlake`` package goes to them with the session (``addPyFile``, or
``addArtifacts`` on Connect), so they need only pyspark and the third-party libraries below
(docs/guide/clusters.md). One small job then imports, on the executors, each of those
libraries and the shipped package; a missing library fails the session there, in one line naming
what to install, before any input is read or any file is written.
"""

from __future__ import annotations

import hashlib
import tempfile
import zipfile
from pathlib import Path

from singerlake.spark.errors import ExecutorsNotReady
from singerlake.spark.masters import is_connect, is_local_master

# What executors import: third-party modules (with the distribution to install for each), then ours.
LIBRARIES = {
    "pyarrow": "pyarrow",
    "boto3": "boto3",
    "smart_open": "smart-open[s3]",
    "farmhash": "pyfarmhash",
    "msgspec": "msgspec",
    "isal": "isal",
}
PACKAGE = Path(__file__).parents[1]  # the installed ``singerlake`` folder
SHIPPED = __name__  # importing this module on an executor proves the shipped package is there


def core_archive() -> Path:
    """A zip of the installed ``singerlake`` package (sources only), built once per version of its files."""
    package = PACKAGE
    sources = sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    digest = hashlib.blake2b(digest_size=8)
    for path in sources:
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    archive = Path(tempfile.gettempdir()) / f"singerlake-core-{digest.hexdigest()}.zip"
    if not archive.exists():
        partial = archive.with_suffix(f".{id(digest)}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zipped:
            for path in sources:
                zipped.write(path, Path("singerlake") / path.relative_to(package))
        partial.replace(archive)
    return archive


def prepare_executors(session) -> None:
    """Ship the core to ``session``'s executors and check, with one job, that they can import it.

    Once per session, and only for executors that may be elsewhere (local masters run this Python).
    """
    if getattr(session, "_singerlake_executors_ready", False) or not runs_elsewhere(session):
        return
    archive = str(core_archive())
    if is_connect(session):
        session.addArtifacts(archive, pyfile=True)
    else:
        session.sparkContext.addPyFile(archive)
    missing = _probe(session)
    if missing:
        raise ExecutorsNotReady("Spark executors cannot run singerlake: " + "; ".join(missing))
    session._singerlake_executors_ready = True


def runs_elsewhere(session) -> bool:
    """Whether the session's executors may be other machines' processes (a cluster, Spark Connect)."""
    return is_connect(session) or not is_local_master(session.sparkContext.master)


def _probe(session) -> list[str]:
    """What the executors lack, one entry per distinct problem (empty when they are ready)."""
    from pyspark.sql import functions as F

    def import_all(_, libraries=LIBRARIES, core=(SHIPPED,)):
        # Runs on an executor, defined here so it travels by value: unpickling it imports nothing.
        # (No type hints: Spark Connect would read them as a pandas UDF's.)
        import importlib
        import sys

        for name in [*libraries, *core]:
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as exc:
                top = (exc.name or name).split(".")[0]
                return f"Python module {top!r} is missing (pip install {libraries.get(top, top)} in {sys.executable})"
            except Exception as exc:  # an incompatible version, a broken install
                return f"importing {name} failed in {sys.executable}: {type(exc).__name__}: {exc}"
        return ""

    tasks = max(2, default_parallelism(session))
    problems = session.range(0, tasks, 1, tasks).select(F.udf(import_all, "string")("id").alias("problem"))
    return sorted({row["problem"] for row in problems.distinct().collect() if row["problem"]})


def default_parallelism(session) -> int:
    """The cluster's default parallelism (cores), also on Spark Connect, which has no SparkContext."""
    if not is_connect(session):
        return max(1, session.sparkContext.defaultParallelism)
    cached = getattr(session, "_singerlake_parallelism", None)
    if cached is None:
        from pyspark.sql import functions as F

        # spark.range without a partition count is cut into the default parallelism's partitions.
        cached = session.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).agg(F.max("p")).first()[0] + 1
        session._singerlake_parallelism = cached
    return cached
