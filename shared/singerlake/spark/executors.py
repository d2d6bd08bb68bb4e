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
import logging
import tempfile
import uuid
import zipfile
from pathlib import Path

from singerlake.spark.defaults import SESSION_DEFAULTS
from singerlake.spark.errors import ExecutorsNotReady
from singerlake.spark.masters import is_connect, is_local_master

log = logging.getLogger(__name__)

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


_digests: dict[tuple, str] = {}


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def core_digest() -> str:
    """The content digest of the package's sources, read once per version of its files (their paths, sizes, mtimes)."""
    sources = _sources()
    key = tuple((str(p), s.st_size, s.st_mtime_ns) for p in sources for s in [p.stat()])
    if key not in _digests:
        digest = hashlib.blake2b(digest_size=8)
        for path in sources:
            digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes())
        _digests[key] = digest.hexdigest()
    return _digests[key]


def core_archive() -> Path:
    """A zip of the installed ``singerlake`` package (sources only), built once per version of its files."""
    package = PACKAGE
    sources = _sources()
    archive = Path(tempfile.gettempdir()) / f"singerlake-core-{core_digest()}.zip"
    if not archive.exists():
        partial = archive.with_suffix(f".{uuid.uuid4().hex}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zipped:
            for path in sources:
                zipped.write(path, Path("singerlake") / path.relative_to(package))
        partial.replace(archive)
    return archive


# The server's template session for a version of the core holds, in its settings, that core's digest once
# shipped there (CORE_CONF) and, once executors that stay the same passed the check, "digest parallelism".
CORE_CONF = "spark.singerlake.core"
READY_CONF = "spark.singerlake.ready"


def attach(remote: str):
    """A session on the Connect server at ``remote`` that holds the core without shipping it again.

    Artifacts are per server-side session, so the core goes once to a template session per (server,
    version of the core), at a session id derived from both; each run clones it (the clone inherits
    its artifacts and settings). Any failure there (an older server, a template closed) falls back
    to a new session, which ``prepare_executors`` ships the core to.
    """
    from pyspark.sql import SparkSession

    digest = core_digest()
    server = remote.split("/;", 1)[0].rstrip("/")
    template_id = str(uuid.UUID(bytes=hashlib.blake2b(f"{server}\0{digest}".encode(), digest_size=16).digest(), version=4))
    template_url = f"{remote.rstrip('/')}{';' if '/;' in remote else '/;'}session_id={template_id}"
    try:
        template = SparkSession.builder.remote(template_url).create()
        core, ready = (template.conf.get(key, "") for key in (CORE_CONF, READY_CONF))
        if core != digest:
            template.addArtifacts(str(core_archive()), pyfile=True)
            for key, value in SESSION_DEFAULTS.items():
                try:
                    template.conf.set(key, value)
                except Exception:  # a server-side setting: the server keeps its own
                    pass
            template.conf.set(CORE_CONF, digest)
        session = template.cloneSession()
        template.client.close()  # now, not when collected at exit: gRPC can hang closing a channel then
    except Exception as exc:  # the clone is a developer API: any refusal means shipping the usual way
        log.debug("no template session on %s (%s): shipping the core to a new session", server, exc)
        return SparkSession.builder.remote(remote).getOrCreate()
    _make_active(session)
    session._singerlake_core = digest
    session._singerlake_template = template_url
    mark_digest, _, parallelism = ready.partition(" ")
    if mark_digest == digest and parallelism.isdigit():
        session._singerlake_parallelism = int(parallelism)
        session._singerlake_executors_ready = True
    return session


def _make_active(session) -> None:
    """Make the clone the process's Spark session (UDFs, schemas in DDL ask for the active one)."""
    cls = type(session)
    with cls._lock:
        cls._default_session = session
    cls._active_session.session = session


def prepare_executors(session) -> None:
    """Ship the core to ``session``'s executors and check, with one job, that they can import it.

    Once per session, and only for executors that may be elsewhere (local masters run this Python).
    On a Connect server whose executors are its own (a local master: none join or leave), once per
    server and version of the core: the check's pass is marked on the server's template session.
    """
    if getattr(session, "_singerlake_executors_ready", False) or not runs_elsewhere(session):
        return
    digest = core_digest()
    if is_connect(session):
        if getattr(session, "_singerlake_core", None) != digest:
            session.addArtifacts(str(core_archive()), pyfile=True)
            session._singerlake_core = digest
    else:
        session.sparkContext.addPyFile(str(core_archive()))
    missing = _probe(session)
    if missing:
        raise ExecutorsNotReady("Spark executors cannot run singerlake: " + "; ".join(missing))
    session._singerlake_executors_ready = True
    template_url = getattr(session, "_singerlake_template", None)
    if template_url and _fixed_executors(session):
        _mark_ready(template_url, f"{digest} {default_parallelism(session)}")


def _fixed_executors(session) -> bool:
    """Whether a Connect server runs a local master: its executors are its own threads, for its whole life.
    Executors of a cluster may come and go (dynamic allocation, a lost node): checked on every run."""
    try:
        master = session.conf.get("spark.master", "")
    except Exception:  # a server that hides its master: check on every run
        return False
    return master == "local" or master.startswith("local[")


def _mark_ready(template_url: str, value: str) -> None:
    from pyspark.sql import SparkSession

    try:
        template = SparkSession.builder.remote(template_url).create()
        template.conf.set(READY_CONF, value)
        template.client.close()
    except Exception as exc:  # the next run checks again
        log.debug("could not mark the executors ready: %s", exc)


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
