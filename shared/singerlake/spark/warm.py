"""A warm Spark for one machine: one long-lived local Spark Connect server that the target, the lake jobs
and the ``singerlake`` command attach to, instead of each run booting a JVM of its own.

The server is pyspark's own (``pyspark.sql.connect.local_server``: a per-user 0700 discovery directory,
a 0600 auth token, loopback only, a version check). Opt in with ``$SINGERLAKE_SPARK_WARM=true`` (or the
target's ``spark_warm`` setting); it applies to in-process local masters (``local[*]``, ``local[N]``).
When it cannot start, the run falls back to a local Spark of its own, with one warning line.

An idle server does not live forever: the run that starts it also starts a small watcher process,
which stops the server once no client has run for ``$SINGERLAKE_SPARK_IDLE_MINUTES`` (default 30).
A client holds a shared lock on ``singerlake-clients.lock`` for its whole life (so a long run is never
cut short) and touches ``singerlake-last-used`` when it starts and when it exits.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from singerlake.errors import ConfigError
from singerlake.spark.errors import SparkError, SparkStartError
from singerlake.spark.masters import is_in_process_master
from singerlake.spark.worker_daemon import IDLE_EXIT_ENV

log = logging.getLogger(__name__)

WARM_ENV = "SINGERLAKE_SPARK_WARM"
IDLE_ENV = "SINGERLAKE_SPARK_IDLE_MINUTES"
DEFAULT_IDLE_MINUTES = 30.0
# pyspark waits 120 s for a server to listen; a small run that waits that long gains nothing over a cold start.
READY_TIMEOUT_S = 60
# Spark keeps a Python worker daemon per session, never stopped: on the server, one ends itself when idle.
WORKER_IDLE_EXIT_S = 60
TRUE, FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")

_client_lock = None  # the shared lock this process holds while it may use the server


def wanted(setting: Any = None) -> bool:
    """Whether to run on the warm server: the ``spark_warm`` setting when given, else ``$SINGERLAKE_SPARK_WARM``."""
    if isinstance(setting, bool):
        return setting
    source = "setting 'spark_warm'" if setting is not None else f"${WARM_ENV}"
    value = str(setting if setting is not None else os.environ.get(WARM_ENV, "")).strip().lower()
    if value not in TRUE + FALSE:
        raise ConfigError(f"{source}: expected true or false, got {value!r}")
    return value in TRUE


def applies(master: str, remote: str | None) -> bool:
    """The warm server stands in for an in-process local master only (a cluster or Connect URL is the user's choice)."""
    return remote is None and is_in_process_master(master)


def idle_minutes() -> float:
    text = os.environ.get(IDLE_ENV, "").strip()
    try:
        minutes = float(text) if text else DEFAULT_IDLE_MINUTES
    except ValueError:
        minutes = -1
    if minutes <= 0:
        raise ConfigError(f"${IDLE_ENV}: expected a number of minutes above 0, got {text!r}")
    return minutes


def directory() -> Path:
    """The discovery directory (pyspark's: ``$TMPDIR/spark-connect-$USER``, or beside ``$SPARK_LOCAL_CONNECT_DISCOVERY``)."""
    from pyspark.sql.connect.local_server import Discovery

    path = Path(Discovery().directory)
    path.mkdir(parents=True, exist_ok=True)
    return path


def remote_url(master: str, options: Callable[[], dict[str, str]]) -> str:
    """The ``sc://`` URL of the warm server, started now (with its watcher) if none is running.

    ``options()``, our local settings (``session.driver_options``), go in as the server's seed settings:
    only the run that starts it sets them.
    Raises ``SparkError`` (no Java, a failed start) with the reason.
    """
    from pyspark.errors import PySparkException
    from pyspark.sql.connect import local_server

    _hold_client_lock()
    with local_server.Discovery() as discovery:  # running: reuse it without working out the settings of a start
        server = local_server.LocalConnectServer(discovery)
        if server.is_reusable():
            return server.reuse_or_start(master, {})
    seed = options()  # also: Java found, PYSPARK_PYTHON this interpreter (the server inherits our env)
    local_server.ServerLauncher._READY_TIMEOUT = READY_TIMEOUT_S
    os.environ[IDLE_EXIT_ENV] = str(WORKER_IDLE_EXIT_S)  # the server's Python worker daemons inherit it, not this run's
    try:
        url = local_server.reuse_or_start_local_connect_server(master, seed)
    except PySparkException as exc:
        raise SparkStartError((exc.getMessageParameters() or {}).get("reason") or str(exc).splitlines()[0]) from None
    except subprocess.TimeoutExpired:
        raise SparkStartError("start-connect-server.sh did not return within 120 s") from None
    finally:
        os.environ.pop(IDLE_EXIT_ENV, None)
    _start_watcher()
    return url


def start_or_fall_back(master: str, options: Callable[[], dict[str, str]]) -> str | None:
    """The warm server's URL, or None (one warning line saying why) for a local Spark of this run's own."""
    try:
        return remote_url(master, options)
    except ConfigError:
        raise
    except (SparkError, OSError) as exc:
        log.warning("warm Spark unavailable (%s): this run starts a local Spark of its own", exc)
        return None


def _hold_client_lock() -> None:
    """Hold the clients' shared lock until this process exits (the watcher stops no server in use)."""
    global _client_lock
    if _client_lock is not None:
        return
    folder = directory()
    _client_lock = open(folder / "singerlake-clients.lock", "a+")
    fcntl.flock(_client_lock.fileno(), fcntl.LOCK_SH)
    touch(folder)
    atexit.register(touch, folder)


def touch(folder: Path) -> None:
    try:
        (folder / "singerlake-last-used").touch()
    except OSError:  # the directory went away: nothing is watching it any more
        pass


def _start_watcher() -> None:
    """Start the idle watcher unless one is running (it holds ``singerlake-watcher.lock`` while it lives)."""
    folder = directory()
    with open(folder / "singerlake-watcher.lock", "a+") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        # A bad setting is the user's error now, not a watcher dying unseen; status shows the limit at once.
        lock.truncate(0)
        lock.write(f"{idle_minutes():g}")
    subprocess.Popen(
        [sys.executable, "-m", "singerlake.spark.warm", "watch"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # outlives this run, and no Ctrl-C of the run's terminal reaches it
    )


def watch() -> None:
    """Stop the server once no client has used it for the idle time; end when the server is gone."""
    from pyspark.sql.connect.local_server import Discovery, LocalConnectServer

    folder = directory()
    watcher = open(folder / "singerlake-watcher.lock", "a+")
    try:
        fcntl.flock(watcher.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # another watcher came first
    minutes = idle_minutes()
    watcher.truncate(0)
    watcher.write(f"{minutes:g} {os.getpid()}")  # for status: the limit this watcher applies (and who applies it)
    watcher.flush()
    limit = minutes * 60
    poll = min(30.0, max(0.2, limit / 10))
    while True:
        time.sleep(poll)
        with Discovery() as discovery:
            server = LocalConnectServer(discovery)
            if not server.is_reusable():
                return
            if idle_seconds(folder) < limit:
                continue
            with open(folder / "singerlake-clients.lock", "a+") as clients:
                try:
                    fcntl.flock(clients.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a run is on it
                pid = server.pid
                server.stop()
        wait_gone(pid)
        return


def idle_seconds(folder: Path) -> float:
    try:
        return time.time() - (folder / "singerlake-last-used").stat().st_mtime
    except OSError:
        return float("inf")


def watched_minutes(folder: Path) -> float | None:
    """The idle time after which the running watcher stops the server; None when no watcher runs."""
    with open(folder / "singerlake-watcher.lock", "a+") as lock:
        lock.seek(0)
        text = lock.read().split()  # "minutes" from the start, "minutes pid" once the watcher runs
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            running = len(text) == 1  # free: a watcher still starting, or none any more
        except BlockingIOError:
            running = True
    return float(text[0]) if text and running else None


def status() -> dict | None:
    """The running warm server (url, pid, Spark version, JVM memory, idle time), or None. Never its token."""
    from pyspark.sql.connect.local_server import Discovery, LocalConnectServer

    with Discovery() as discovery:
        server = LocalConnectServer(discovery)
        if not server.is_reusable():
            return None
        folder = Path(discovery.directory)
        return {
            "url": server.url,
            "pid": server.pid,
            "spark_version": server.spark_version,
            "rss_mib": rss_mib(server.pid),
            "idle_s": round(idle_seconds(folder), 1),
            "idle_stop_minutes": watched_minutes(folder),
            "discovery": discovery.path,
        }


def stop() -> int | None:
    """Stop the warm server and wait for its JVM to end; its pid, or None when none was running."""
    from pyspark.sql.connect.local_server import Discovery, LocalConnectServer

    with Discovery() as discovery:
        server = LocalConnectServer(discovery)
        pid = server.pid if server.is_reusable() else None
        if server.stop() is None:
            raise SparkStartError(f"could not check that pid {server.pid} is the warm Spark server: not stopped")
    if pid is not None:
        wait_gone(pid)
    return pid


def wait_gone(pid: int | None, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while pid is not None and time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)


def rss_mib(pid: int | None) -> float | None:
    """Resident memory of a process (Linux /proc), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


if __name__ == "__main__" and sys.argv[1:] == ["watch"]:
    watch()
