"""The Python worker daemon of local masters (``spark.python.daemon.module``): pyspark's own, started faster.

Spark puts its ``pyspark.zip`` first on the workers' path, and a zip holds no compiled bytecode,
so every daemon and every worker it forks compiles pyspark's modules again: about 0.5 s on the
critical path of a short run's first job. On a local master the workers run this installation,
so when the installed pyspark is the very package that zip came from, the daemon drops the zips
and imports the installed modules with their cached bytecode. Anything else keeps Spark's path.
The workers also give the memory Arrow frees back to the system at once, and collect only their
young objects between tasks (``YoungCollections``).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import threading
import time

IDLE_EXIT_ENV = "SINGERLAKE_WORKER_IDLE_EXIT_S"


class YoungCollections:
    """The ``gc`` module as pyspark's daemon sees it: its full collection after each task of a reused worker
    made a collection of the young generations. A full one walks every object of the worker (pyarrow's,
    numpy's, pyspark's: 50-340 ms each, 164 tasks of a 10M projection spent 22 s in them, freeing
    nothing); a task's cycles are among the young objects, and Python's own collections reach the old."""

    def collect(self, generation: int = 1) -> int:
        return gc.collect(min(generation, 1))

    def __getattr__(self, name: str):
        return getattr(gc, name)


def _spark_zips() -> list[str]:
    """Spark's zips on the path, if the installed pyspark is the package they ship in (and py4j is installed)."""
    zips = [entry for entry in sys.path if entry.endswith(".zip") and os.path.basename(entry).startswith(("pyspark", "py4j"))]
    saved = sys.path[:]
    sys.path[:] = [entry for entry in saved if entry not in zips]
    try:
        pyspark, py4j = importlib.util.find_spec("pyspark"), importlib.util.find_spec("py4j")
    finally:
        sys.path[:] = saved
    if pyspark is None or pyspark.origin is None or py4j is None:
        return []
    lib = os.path.realpath(os.path.join(os.path.dirname(pyspark.origin), "python", "lib"))
    return [entry for entry in zips if os.path.dirname(os.path.realpath(entry)) == lib]


def main() -> None:
    # Arrow's allocator (mimalloc) keeps freed pages for a while: a worker that reads one batch
    # of records after another then holds the peak of each. Given back at once (0), each task faults
    # its pages in anew. The workers inherit this; a 10M first projection: 0 ms 86-90 s and 1,264-1,286
    # MiB, 100 ms 79-80 s and 1,333-1,356 MiB, 1 s 80.5 s and 1,440 MiB.
    os.environ.setdefault("MIMALLOC_PURGE_DELAY", "100")
    zips = _spark_zips()
    sys.path[:] = [entry for entry in sys.path if entry not in zips]
    from pyspark import daemon

    daemon.gc = YoungCollections()
    if os.environ.get(IDLE_EXIT_ENV):
        threading.Thread(target=_exit_when_idle, args=(float(os.environ[IDLE_EXIT_ENV]),), daemon=True).start()
    daemon.manager()


def _exit_when_idle(seconds: float) -> None:
    """On the warm Spark server each session gets a daemon of its own, which Spark never stops when the
    session ends: without a worker for ``seconds`` (Spark ends idle workers after a minute), it ends
    itself. Should its session still want one, Spark starts the daemon again."""
    children = f"/proc/{os.getpid()}/task/{os.getpid()}/children"  # the workers, forked by the main thread
    idle_since = time.monotonic()
    while True:
        time.sleep(min(10.0, seconds / 2))
        try:
            with open(children) as listed:
                busy = bool(listed.read().strip())
        except OSError:  # not Linux: keep running, as pyspark's daemon does
            return
        if busy:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= seconds:
            os._exit(0)


if __name__ == "__main__":
    main()
