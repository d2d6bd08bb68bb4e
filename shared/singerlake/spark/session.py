"""Starting Spark: local (the default), a cluster (``spark://``, k8s, yarn) or Spark Connect (``sc://``).

Local masters get loopback networking, this interpreter for the Python workers and small-machine
defaults. Any other master is someone else's cluster: its executors get the core shipped to them
and are checked for the libraries it needs before any work (``singerlake.spark.executors``). The user's
conf always comes last.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

from singerlake.errors import ConfigError
from singerlake.spark.defaults import SESSION_DEFAULTS
from singerlake.spark.errors import SparkStartError
from singerlake.spark.java import ensure_java
from singerlake.spark.jvm_cache import cds_java_options
from singerlake.spark.masters import is_in_process_master, is_local_master, resolve_master

log = logging.getLogger(__name__)

# Local masters only: a cluster's executors on other machines must reach the driver by its real address.
LOCAL_DEFAULTS = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "640m",
}
# Short-lived local driver: C1-compiled code starts faster and our jobs mostly move bytes. The heap
# starts small and gives back what a full GC frees, so a long run stays at the size of a short one
# (peak RSS of a whole landing, 5M records: 0.94 GB with these flags, 1.17 GB without; 1M: 0.90 against 0.97).
DRIVER_JAVA_OPTIONS = (
    "-XX:+ExitOnOutOfMemoryError -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xms64m -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=30"
)


# The driver's logging: warnings and errors, in our logs' layout, without Spark's start-up banner.
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
# The JVM's own notice for the module Spark's launcher always adds: noise on every start.
JVM_NOTICE = b"WARNING: Using incubator modules:"


_PYSPARK_IMPORT = threading.Lock()


def import_pyspark() -> None:
    """Import pyspark whole, one thread at a time. pyspark and pyspark.sql import each other: two
    threads importing them at once (the JVM's early launch, the session's start) can each be handed
    the other's half-initialised module ("cannot import name 'SQLContext' from partially initialized
    module 'pyspark.sql'") and the run fails to start."""
    with _PYSPARK_IMPORT:
        import pyspark.sql  # noqa: F401


def spark_session(
    master: str | None = "local[*]",
    app_name: str = "singerlake",
    conf: dict[str, Any] | None = None,
    remote: str | None = None,
    warm: Any = None,
):
    """A SparkSession for ``master`` (or a Spark Connect ``remote``), with ``conf`` applied last.

    ``warm`` (the ``spark_warm`` setting; None: ``$SINGERLAKE_SPARK_WARM``): a local master's session is
    one of the machine's warm Spark Connect server (``singerlake.spark.warm``), started if need be.
    On anything but a local master the core is shipped to the executors, which are then checked
    for the libraries it needs (one small job), so a missing one fails here, before any work.
    """
    import_pyspark()
    from pyspark.sql import SparkSession

    from singerlake.spark import warm as warm_spark

    master, remote = resolve_master(master, remote)
    on_warm = warm_spark.applies(master, remote) and warm_spark.wanted(warm)
    if on_warm:
        remote = warm_spark.start_or_fall_back(master, lambda: driver_options(master, conf))
        # The run's server-side session (its Python workers) ends with the run, not an hour later.
        os.environ.setdefault("SPARK_CONNECT_RELEASE_SESSION_ON_EXIT", "true")
    builder = SparkSession.builder.appName(app_name)
    if remote:
        from singerlake.spark.executors import attach

        session = attach(remote)
        _configure_connect(session, conf, server_defaults=bool(on_warm))
    else:
        options = driver_options(master, conf)
        for key, value in options.items():
            builder = builder.config(key, value)
        _launch_driver_jvm(options)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
    from singerlake.spark.executors import prepare_executors

    prepare_executors(session)
    return session


def _configure_connect(session, conf: dict[str, Any] | None, server_defaults: bool = False) -> None:
    """Apply our defaults and the user's conf to a Connect session, as far as the server allows.

    A session cloned from the server's template has our defaults already. ``server_defaults``: the
    warm server, whose settings (the user's too) were seeded when it started, so a refusal is no error.
    """
    from pyspark.errors import PySparkException

    defaults = {} if getattr(session, "_singerlake_core", None) else SESSION_DEFAULTS
    for key, value in {**defaults, **{k: str(v) for k, v in (conf or {}).items()}}.items():
        try:
            session.conf.set(key, value)
        except PySparkException as exc:  # static or server-side settings cannot change per session
            if key in (conf or {}) and not server_defaults:
                raise ConfigError(f"Spark Connect server refused setting {key}: {str(exc).splitlines()[0]}") from None
            log.debug("Connect server keeps its own %s", key)


JAVA_OPTIONS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")


def driver_options(master: str, conf: dict[str, Any] | None = None) -> dict[str, str]:
    """The Spark settings of a session on ``master`` (not Connect), ``conf`` last; sets the environment they need."""
    import_pyspark()
    java_home = ensure_java()
    options = {"spark.master": master, **SESSION_DEFAULTS}
    executor_python = (conf or {}).get("spark.pyspark.python")
    if executor_python:  # honoured by spark-submit only; PySpark itself reads the environment
        os.environ["PYSPARK_PYTHON"] = str(executor_python)
    if is_local_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python workers must run this interpreter (its packages), not whatever "python3" is first on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # Meltano runs plugins with PYTHONWARNINGS=once; the Python workers inherit it, and pyspark's
        # worker daemon then reports the pipes it leaves to the OS at exit as ResourceWarnings.
        if os.environ.get("PYTHONWARNINGS") and "ignore::ResourceWarning" not in os.environ["PYTHONWARNINGS"]:
            os.environ["PYTHONWARNINGS"] += ",ignore::ResourceWarning"
        options.update(LOCAL_DEFAULTS)
        if os.environ["PYSPARK_PYTHON"] == sys.executable:  # the workers run this installation: start them faster
            options["spark.python.daemon.module"] = "singerlake.spark.worker_daemon"
    cds = cds_java_options(java_home) if master.startswith("local") else ""
    options["spark.driver.extraJavaOptions"] = f"{DRIVER_JAVA_OPTIONS} -Dlog4j.configurationFile={LOG4J_CONFIG} {cds}".strip()
    for key, value in (conf or {}).items():  # JVM options add to ours (the last of two equal flags wins); others replace
        options[key] = f"{options[key]} {value}" if key in JAVA_OPTIONS and options.get(key) else str(value)
    return options


def prelaunch(master: str) -> None:
    """Boot the driver JVM for ``master`` in the background now; ``spark_session`` adopts it.

    For a command that knows its master before it imports anything heavy: the JVM's start-up
    (the longest step of a small run) then overlaps the imports and the reading of settings.
    A failure here is silent: ``spark_session`` launches again and reports it.
    """

    def launch() -> None:
        try:
            _launch_driver_jvm(driver_options(master))
        except Exception:
            log.debug("early JVM launch failed; the session will retry", exc_info=True)

    threading.Thread(target=launch, name="singerlake-jvm-prelaunch", daemon=True).start()


def _launch_driver_jvm(options: dict[str, str]) -> None:
    """Start the driver JVM as getOrCreate would, but with its output piped to our stderr.

    A target's stdout carries Singer messages (STATE) and the JVM would inherit it: start-up
    errors, -Xlog output and thread dumps would land between the STATE lines. A pipe (not our
    stderr itself) also means the JVM's own shutdown, after we exit, does not hold the stderr of
    whoever runs us (Meltano waits for it to close). No-op when this process already runs a JVM.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return
        read_end, write_end = os.pipe()
        copier = threading.Thread(target=_copy_to_stderr, args=(read_end,), name="singerlake-jvm-output", daemon=True)
        copier.start()
        try:
            gateway = launch_gateway(SparkConf().setAll(list(options.items())), popen_kwargs={"stdout": write_end, "stderr": write_end})
        except BaseException:
            os.close(write_end)
            copier.join(timeout=5)  # the JVM died: its last words (e.g. a bad heap size) go out before our error
            raise
        os.close(write_end)  # the JVM holds its own copy
        SparkContext._ensure_initialized(gateway=gateway)


def _copy_to_stderr(read_end: int) -> None:
    with os.fdopen(read_end, "rb") as pipe:
        for line in iter(pipe.readline, b""):
            if line.startswith(JVM_NOTICE):
                continue
            sys.stderr.buffer.write(line)
            sys.stderr.flush()


def stop_session(session, master: str) -> None:
    """Stop a Spark application; local-cluster's per-application logs under SPARK_HOME/work go too."""
    context = session.sparkContext
    app_id = context.applicationId
    # pyspark's accumulator server sees a shutdown only at its next poll, up to a second later: it
    # stops in the background instead of holding up the end of every landing (0.97 s, now 0.07 s)
    server, context._accumulatorServer = getattr(context, "_accumulatorServer", None), None
    session.stop()
    if server is not None:
        threading.Thread(target=server.shutdown, name="singerlake-accumulator-stop", daemon=True).start()
    if master.startswith("local-cluster"):
        import shutil
        from pathlib import Path

        import pyspark

        shutil.rmtree(Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent) / "work" / app_id, ignore_errors=True)


LOCAL_START_DEFER_S = 0.5  # a landing's Spark on this machine starts this late: a run whose input ended before needs none


class SparkStarter:
    """Starts a SparkSession in the background, so the JVM boots while input is being read.

    ``warm_up(session)`` (optional) then runs only if nobody has asked for the session yet: it
    prepares executors while a long input is read, and would only delay a short run's first job.
    ``defer_s``: start only that long after construction (or when asked for sooner), so that a run
    whose input ends before may ``skip`` Spark altogether.
    """

    def __init__(self, factory, warm_up=None, defer_s: float | None = None):
        self._factory = factory
        self._warm_up = warm_up
        self._wanted = threading.Event()
        self._session = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._start, name="singerlake-spark-start", daemon=True)
        self._lock = threading.Lock()
        self._begun = self._skipped = False
        self._timer = None
        if defer_s is None:
            self.begin()
        else:
            self._timer = threading.Timer(defer_s, self.begin)
            self._timer.daemon = True
            self._timer.start()

    def _start(self) -> None:
        try:
            session = self._factory()
            if self._warm_up is not None and not self._wanted.is_set():
                self._warm_up(session)
            self._session = session
        except BaseException as exc:  # reported by get() in the caller's thread
            self._error = exc

    def begin(self, asked: bool = False) -> None:
        """Start now, unless started, or skipped and not ``asked`` for."""
        with self._lock:
            if self._begun or (self._skipped and not asked):
                return
            self._begun = True
            self._thread.start()

    def skip(self) -> bool:
        """Never start unless asked for: True when Spark had not begun to start (the caller does the work itself)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._skipped = not self._begun
            return self._skipped

    def __call__(self):
        self._wanted.set()
        self.begin(asked=True)
        self._thread.join()
        if self._error is not None:
            raise SparkStartError(f"Spark failed to start: {self._error}") from self._error
        return self._session

    def started(self):
        """The session if it is up already, else None (for clean-up)."""
        return self._session


class OnDemand:
    """A SparkSession started the first time a job asks for it (``__call__``), for a job that may not
    need one: with a master of this process's machine (``local``, ``local[N]``), a job of one task
    runs in the driver's process instead (``runner.run_items``), so a small run starts no JVM."""

    def __init__(self, factory, master: str | None, remote: str | None = None):
        self._factory = factory
        master, remote = resolve_master(master, remote)
        self.in_process = remote is None and is_in_process_master(master)
        self._session = None
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            if self._session is None:
                self._session = self._factory()
            return self._session


def runs_here(spark, one_task: bool) -> bool:
    """Whether a job of ``one_task`` runs in this process: ``spark`` an ``OnDemand`` session not started, of a local master."""
    return one_task and isinstance(spark, OnDemand) and spark.in_process


def session_of(spark):
    """The SparkSession of ``spark``: itself, or an ``OnDemand``'s, started now."""
    return spark() if isinstance(spark, OnDemand) else spark
