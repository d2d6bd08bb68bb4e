"""Pushing many files on Spark (SPEC.md §14): the per-file work on the executors, the commits on the driver.

The driver gathers the files (path, size, mtime, span) as the threaded push does, cuts them into
the same chunks of COMMIT_FILES and draws one txn per chunk. One Spark job (``jobs.runner.run_items``:
one DataFrame row per file, a task per few hundred files, each task storing several at once) runs
``store.store`` on the executors: read, hash, store the bytes create-only, write the record. Only
the records come back, as JSON; the driver then commits each chunk whose files were all stored,
with ``index.commit`` (pointers, then the segment: the commit point), exactly as the threaded push.

The executors read each file at the path the driver saw: on a local master they share this
machine's disk; a cluster's executors must mount the pushed paths at the same place (the CLI asks
for ``--source-shared``). A task that fails and is retried stores the same bytes under the same
key and rewrites the same record (same txn): nothing is committed twice.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from pathlib import Path

from singerlake.errors import SingerlakeError, one_line
from singerlake.files.errors import Aborted, PushFailed
from singerlake.files.lease import push_leases
from singerlake.files.store import COMMIT_FILES, PushResult, Source, push_chunk, store
from singerlake.spark.executors import default_parallelism
from singerlake.spark.runner import Progress, run_items
from singerlake.storage import Storage
from singerlake.text import counted
from singerlake.times import new_file_id

TASKS_PER_CORE = 4  # tasks finish at different times: a few per core keep every core busy to the end
MIN_FILES_PER_TASK = 32
MAX_FILES_PER_TASK = 1000  # progress moves at least every thousand files; a failed task redoes at most as many


def _reporter(report: Callable[[int, int], None]) -> Progress:
    """The runner's progress, passed on to a push's ``progress(done, total)`` when the file count moves."""
    last = [-1]

    def show(files: int, total_files: int, done_bytes: int, total_bytes: int) -> None:
        if files != last[0]:
            last[0] = files
            report(files, total_files)

    return show


def files_per_task(files: int, cores: int) -> int:
    return max(MIN_FILES_PER_TASK, min(MAX_FILES_PER_TASK, math.ceil(files / (TASKS_PER_CORE * cores))))


def store_item(storage: Storage, what: str, where: str, work_id: str | None, item: dict) -> dict:
    """Executor side: ``store.store`` of one file; its failure (a file that changed, that is not
    there, that cannot be read) is its result, so the other files are still committed."""
    source = Source(Path(item["path"]), item["size"], item["mtime_ns"], item["start"], item["end"])
    try:
        record, duplicate = store(storage, source, what, where, work_id, item["txn"])
    except (SingerlakeError, OSError) as exc:
        return {"failed": f"{item['path']}: {one_line(exc)}", "pid": os.getpid()}
    return {"record": record, "duplicate": duplicate, "pid": os.getpid()}


def push_on_spark(
    spark,
    storage: Storage,
    sources: list[Source],
    *,
    what: str,
    where: str,
    work_id: str | None,
    progress: Callable[[int, int], None] | None = None,
) -> PushResult:
    """Store ``sources`` (in push order) on the executors in one Spark job, then commit their chunks."""
    chunks = [sources[first : first + COMMIT_FILES] for first in range(0, len(sources), COMMIT_FILES)]
    txns = [new_file_id() for _ in chunks]
    items = [
        {"path": str(s.path), "size": s.size, "mtime_ns": s.mtime_ns, "start": s.start, "end": s.end, "txn": txns[n]}
        for n, chunk in enumerate(chunks)
        for s in chunk
    ]
    per_task = files_per_task(len(items), default_parallelism(spark))
    with push_leases(storage, what, txns):  # held from before the first byte is stored to each chunk's commit (SPEC.md §15)
        outcomes = run_items(
            spark,
            items,
            functools.partial(store_item, storage, what, where, work_id),
            progress=_reporter(progress) if progress else None,
            sizes=[s.size for s in sources],
            items_per_task=per_task,
            threads=storage.parallel_requests,
        )
        workers = len({o["pid"] for o in outcomes})
        result = PushResult(spark={"jobs": 1, "tasks": math.ceil(len(items) / per_task), "worker_processes": workers})
        seen: dict[str, dict] = {}
        failed: list[str] = []
        first = 0
        # Stored at once, two chunks' copies of the same bytes: whichever stored them, this push did.
        result.stored_here = {o["record"]["id"] for o in outcomes if o.get("duplicate") is False}
        for txn, chunk in zip(txns, chunks, strict=True):
            mine = outcomes[first : first + len(chunk)]
            first += len(chunk)
            problems = [o["failed"] for o in mine if "failed" in o]
            if problems:
                failed.extend(problems)
                continue  # its stored bytes and records stay invisible (SPEC.md §14); pushing again commits them
            try:
                result.commit_chunk(storage, what, txn, [(o["record"], o["duplicate"]) for o in mine], seen)
            except Aborted:  # a vacuum judged the lease stale: this chunk again, on the driver (SPEC.md §15)
                push_chunk(storage, chunk, what, where, work_id, result, seen)
    if failed:
        committed = f"{counted(len(result.pushed), 'file')} committed" if result.pushed else "nothing committed"
        raise PushFailed(f"{counted(len(failed), 'file')} could not be pushed ({committed}; push again to commit the rest): {failed[0]}")
    return result
