"""Running lake-job work on Spark executors: one DataFrame row per work item, results back as JSON.

Items (file entries, compaction groups, ...) are plain JSON documents; ``work`` runs on the
executors (it must be picklable: module-level functions and Storage objects are). While the job
runs, a thread polls Spark's status tracker and reports items and bytes done to a ``progress`` callback.

Lake jobs plan across streams: the driver plans every selected stream (``for_each_stream``), the
work items of all streams go to the executors as one Spark job (``run_stream_items``, each item
naming its ``tap_id`` and ``stream``), and the results are applied per stream. A stream that fails
anywhere on the way is recorded in ``Failures`` and left out; the other streams finish.
"""

from __future__ import annotations

import functools
import json
import math
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from singerlake.errors import one_line
from singerlake.spark.errors import StreamsFailed
from singerlake.spark.masters import is_connect
from singerlake.spark.results import arrow_without_pandas, result_batch, result_schema
from singerlake.spark.session import runs_here, session_of

RESULT_COLUMNS = {"seq": "long", "result": "string"}
ITEMS_PER_TASK = 64
THREADS_PER_TASK = 8
DRIVER_THREADS = 8  # per-stream planning and commits on the driver: storage round trips, not CPU

Result = TypeVar("Result")
StreamId = tuple[str, str]  # (tap_id, stream)


# Progress, reported as the work moves: (items done, items, bytes done, bytes); the last call has
# items done == items. The CLI draws it (``cli/output.py``); the runner only measures.
Progress = Callable[[int, int, int, int], None]


def _run_item(work: Callable[[dict], Any], item: str) -> str:
    return json.dumps(work(json.loads(item)))


def _run_partition(work: Callable[[dict], Any], threads: int, batches: Iterator[Any]) -> Iterator[Any]:
    arrow_without_pandas()  # before the threads: nothing else imports meanwhile
    # Work items wait on storage (local reads, S3 requests) far more than on the CPU: overlap them.
    with ThreadPoolExecutor(threads) as pool:
        for batch in batches:
            results = list(pool.map(functools.partial(_run_item, work), batch.column("item").to_pylist()))
            yield result_batch(RESULT_COLUMNS, seq=batch.column("seq").to_pylist(), result=results)


def run_items(
    spark,
    items: list[dict],
    work: Callable[[dict], Any],
    progress: Progress | None = None,
    sizes: list[int] | None = None,
    items_per_task: int = ITEMS_PER_TASK,
    threads: int = THREADS_PER_TASK,
) -> list[Any]:
    """``[work(item) for item in items]``, computed on the executors, in item order.

    Each Spark task takes about ``items_per_task`` items and works on ``threads`` of them at once.
    A job of one task with ``spark`` an ``OnDemand`` session of a local master runs here, in the
    driver's process, as that task would (the same threads, the same JSON round trip), and starts
    no JVM: the executor of a local master is this machine anyway.
    """
    import pyarrow as pa

    if not items:
        return []
    arrow_without_pandas()
    tasks = max(1, math.ceil(len(items) / items_per_task))
    table = pa.table({"seq": pa.array(range(len(items)), pa.int64()), "item": pa.array([json.dumps(i) for i in items], pa.string())})
    if runs_here(spark, tasks == 1):
        batches = _run_partition(work, threads, iter(table.to_batches()))
        results = [result for batch in batches for result in batch.column("result").to_pylist()]
        if progress:
            progress(len(items), len(items), sum(sizes or []), sum(sizes or []))
        return list(map(json.loads, results))
    spark = session_of(spark)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(math.ceil(len(items) / tasks)))
    frame = spark.createDataFrame(table).mapInArrow(lambda batches: _run_partition(work, threads, batches), result_schema(**RESULT_COLUMNS))
    watcher = _Watcher(spark, progress, len(items), sizes or [0] * len(items), tasks) if progress else None
    try:
        rows = frame.collect()
    finally:
        if watcher:
            watcher.stop()
    return [json.loads(row["result"]) for row in sorted(rows, key=lambda row: row["seq"])]


class _Watcher:
    """Reports the running job's finished tasks; each task holds about the same number of items.

    Classic Spark: a thread polls the status tracker. Spark Connect has no SparkContext: the
    server streams the job's progress to a registered handler instead.
    """

    def __init__(self, spark, progress: Progress, items: int, sizes: list[int], tasks: int):
        self.progress, self.items, self.total_bytes, self.tasks = progress, items, sum(sizes), tasks
        self.spark = spark
        self._stop = threading.Event()
        self._thread = None
        if is_connect(spark):
            spark.registerProgressHandler(self._on_connect_progress)
        else:
            self.tracker = spark.sparkContext.statusTracker()
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()

    def _show(self, done_tasks: int) -> None:
        share = min(1.0, done_tasks / self.tasks)
        self.progress(int(share * self.items), self.items, int(share * self.total_bytes), self.total_bytes)

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            done = 0
            for stage_id in self.tracker.getActiveStageIds():
                info = self.tracker.getStageInfo(stage_id)
                if info is not None:
                    done = max(done, info.numCompletedTasks)
            self._show(done)

    def _on_connect_progress(self, stages, inflight_tasks, operation_id, done) -> None:
        self._show(max((stage.num_completed_tasks for stage in stages or ()), default=0))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        else:
            self.spark.removeProgressHandler(self._on_connect_progress)
        self.progress(self.items, self.items, self.total_bytes, self.total_bytes)


# -- many streams in one job -------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamFailure:
    """A stream a lake job could not finish, and why, in one line."""

    tap_id: str
    stream: str
    cause: str

    def __str__(self) -> str:
        return f"tap {self.tap_id!r}, stream {self.stream!r}: {self.cause}"

    def to_dict(self) -> dict:
        return asdict(self)


class Failures:
    """The streams of one lake job that failed so far (thread-safe); the first cause of each is kept."""

    def __init__(self) -> None:
        self._found: dict[StreamId, StreamFailure] = {}
        self._lock = threading.Lock()

    def add(self, tap_id: str, stream: str, cause: str) -> None:
        with self._lock:
            self._found.setdefault((tap_id, stream), StreamFailure(tap_id, stream, cause))

    def has(self, tap_id: str, stream: str) -> bool:
        return (tap_id, stream) in self._found

    def deliver(self, sink: list[StreamFailure] | None) -> None:
        """Add the failures to the caller's ``sink``; with no sink, raise them (library callers see errors as before)."""
        found = sorted(self._found.values(), key=lambda f: (f.tap_id, f.stream))
        if sink is not None:
            sink.extend(found)
        elif found:
            raise StreamsFailed(found)


def selected_streams(lake, tap_id: str | None = None, stream: str | None = None) -> list[StreamId]:
    """The streams a job covers: one, a tap's (from its catalogue), or the whole lake's."""
    return [(tap, name) for tap in ([tap_id] if tap_id else lake.taps()) for name in ([stream] if stream else lake.streams(tap))]


def for_each_stream(
    streams: list[StreamId], work: Callable[[str, str], Result], failures: Failures, threads: int = DRIVER_THREADS
) -> dict[StreamId, Result]:
    """``work(tap_id, stream)`` for each stream on a small thread pool, by stream in the given order;
    a stream whose work raises is recorded in ``failures`` and left out."""

    def guarded(stream_id: StreamId) -> tuple[bool, Any]:
        try:
            return True, work(*stream_id)
        except Exception as exc:
            failures.add(*stream_id, one_line(exc))
            return False, None

    if threads == 1:  # on the caller's thread, so Spark jobs keep its job group and properties
        outcomes = [guarded(stream_id) for stream_id in streams]
    else:
        with ThreadPoolExecutor(max(1, min(threads, len(streams)))) as pool:
            outcomes = list(pool.map(guarded, streams))
    return {stream_id: result for stream_id, (ok, result) in zip(streams, outcomes, strict=True) if ok}


def _guarded(work: Callable[[dict], Any], item: dict) -> dict:
    """Executor side: an item's exception becomes its result, so it fails its stream, not the Spark job."""
    try:
        return {"result": work(item)}
    except Exception as exc:
        return {"failed": one_line(exc)}


def run_stream_items(
    spark, items: list[dict], work: Callable[[dict], Any], failures: Failures, progress: Progress | None = None, **run_options
) -> list[Any | None]:
    """``run_items`` over the items of many streams in one Spark job. Each item names its ``tap_id``
    and ``stream``; an item whose work raises fails its stream (recorded in ``failures``) and gets None."""
    outcomes = run_items(spark, items, functools.partial(_guarded, work), progress, **run_options)
    for item, outcome in zip(items, outcomes, strict=True):
        if "failed" in outcome:
            failures.add(item["tap_id"], item["stream"], outcome["failed"])
    return [outcome.get("result") for outcome in outcomes]


def by_stream(items: list[dict], results: list[Any | None]) -> dict[StreamId, list[tuple[dict, Any]]]:
    """Items that succeeded, with their results, grouped by stream (in item order)."""
    grouped: dict[StreamId, list[tuple[dict, Any]]] = {}
    for item, result in zip(items, results, strict=True):
        if result is not None:
            grouped.setdefault((item["tap_id"], item["stream"]), []).append((item, result))
    return grouped
