"""Running lake-job work on Spark executors: one DataFrame row per work item, results back as JSON.

Items (file entries, compaction groups, ...) are plain JSON documents; ``work`` runs on the
executors (it must be picklable: module-level functions and Storage objects are). While the job
runs, a thread polls Spark's status tracker and reports files and bytes done on a terminal.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

RESULT_SCHEMA = "seq long, result string"
ITEMS_PER_TASK = 64
THREADS_PER_TASK = 8


class Progress:
    """``files 120/4,000, bytes 12.0/400.0 MiB`` on stderr, rewritten in place; silent unless a terminal."""

    def __init__(self, label: str, enabled: bool | None = None):
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled

    def show(self, files: int, total_files: int, done_bytes: int, total_bytes: int) -> None:
        if self.enabled:
            mib = 1 << 20
            sys.stderr.write(
                f"\r{self.label}: files {files:,}/{total_files:,}, bytes {done_bytes / mib:,.1f}/{total_bytes / mib:,.1f} MiB "
            )
            sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _run_partition(work: Callable[[dict], Any], batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    def run(item: str) -> str:
        return json.dumps(work(json.loads(item)))

    # Work items wait on storage (local reads, S3 requests) far more than on the CPU: overlap them.
    with ThreadPoolExecutor(THREADS_PER_TASK) as pool:
        for batch in batches:
            results = list(pool.map(run, batch.column("item").to_pylist()))
            yield pa.RecordBatch.from_pydict({"seq": batch.column("seq"), "result": pa.array(results, pa.string())})


def run_items(
    spark, items: list[dict], work: Callable[[dict], Any], progress: Progress | None = None, sizes: list[int] | None = None
) -> list[Any]:
    """``[work(item) for item in items]``, computed on the executors, in item order."""
    import pyarrow as pa

    if not items:
        return []
    table = pa.table({"seq": pa.array(range(len(items)), pa.int64()), "item": pa.array([json.dumps(i) for i in items], pa.string())})
    tasks = max(1, math.ceil(len(items) / ITEMS_PER_TASK))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(math.ceil(len(items) / tasks)))
    frame = spark.createDataFrame(table).mapInArrow(lambda batches: _run_partition(work, batches), RESULT_SCHEMA)
    watcher = _Watcher(spark, progress, len(items), sizes or [0] * len(items), tasks) if progress and progress.enabled else None
    try:
        rows = frame.collect()
    finally:
        if watcher:
            watcher.stop()
    return [json.loads(row["result"]) for row in sorted(rows, key=lambda row: row["seq"])]


class _Watcher:
    """Polls the running stage's finished tasks; each task holds about the same number of items."""

    def __init__(self, spark, progress: Progress, items: int, sizes: list[int], tasks: int):
        self.progress, self.items, self.total_bytes, self.tasks = progress, items, sum(sizes), tasks
        self.tracker = spark.sparkContext.statusTracker()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            done = 0
            for stage_id in self.tracker.getActiveStageIds():
                info = self.tracker.getStageInfo(stage_id)
                if info is not None:
                    done = max(done, info.numCompletedTasks)
            share = min(1.0, done / self.tasks)
            self.progress.show(int(share * self.items), self.items, int(share * self.total_bytes), self.total_bytes)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.progress.show(self.items, self.items, self.total_bytes, self.total_bytes)
        self.progress.done()
