"""Push files into the lake (SPEC.md §14): bytes and record first, the index segment last.

Many files go through a thread pool and commit in chunks (``store``), each chunk one segment: a
file is visible whole or not at all. A push of SPARK_FILES files or more, given a
Spark session, stores them on the executors instead (``spark_push``) and commits the same chunks.
Small files and records are written without a sync each; the commit syncs them all at once before its commit point (``index.commit``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from singerlake.errors import ConfigError
from singerlake.files.record import check_labels, check_span
from singerlake.files.store import COMMIT_FILES, PushResult, Source, push_chunk, size_lies, unreadable
from singerlake.storage import Storage

SPARK_FILES = 20_000  # a push of this many files runs on Spark when it has a session (use_spark="auto")
SPARK_MODES = ("auto", "always", "never")


def gather(paths: list[str | os.PathLike], start: int | None, end: int | None) -> list[Source]:
    """Every file named or below a named directory, checked a readable regular file of a true size and
    timed, before anything is written."""
    sources: list[Source] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = sorted(Path(d, name) for d, _, names in os.walk(path) for name in names)
        elif path.exists():
            found = [path]
        else:
            raise ConfigError(f"{given}: no such file or directory")
        for file in found:
            sources.append(_source(file, start, end))
    if not sources:
        raise ConfigError(f"nothing to push: {', '.join(map(str, paths))} holds no file")
    return sources


def _source(path: Path, start: int | None, end: int | None) -> Source:
    info = _checked(path)
    first = info.st_mtime_ns // 1_000_000 if start is None else start
    check_span(first, end, str(path))
    return Source(path.absolute(), info.st_size, info.st_mtime_ns, first, end)


FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _checked(path: Path) -> os.stat_result:
    """The stat of a regular file whose bytes can be read and whose size is what it holds. Anything
    else is refused before it is opened (opening a FIFO waits for a writer; a device never ends)."""
    try:
        mode = os.stat(path).st_mode
        _check_regular(path, mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # NONBLOCK: had it become a FIFO since, this returns at once
        try:
            info = os.fstat(fd)
            _check_regular(path, info.st_mode)
            # Its last byte, and nothing after: /proc and /sys files say 0 or 4,096 bytes whatever they hold.
            tail = os.pread(fd, 2, max(info.st_size - 1, 0))
        finally:
            os.close(fd)
    except OSError as exc:
        raise unreadable(path, exc) from None
    if len(tail) != min(info.st_size, 1):
        raise size_lies(path, info.st_size)
    return info


def _check_regular(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in FILE_KINDS if test(mode)), "a special file")
        raise ConfigError(f"{path}: {kind}, not a regular file: only regular files can be pushed; nothing was pushed")


def push(
    storage: Storage,
    paths: list[str | os.PathLike],
    *,
    what: str,
    where: str,
    work_id: str | None = None,
    start: int | None = None,
    end: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    spark: Any = None,
    use_spark: str = "auto",
) -> PushResult:
    """Push files (times in ms since the epoch; ``start`` defaults to each file's mtime).

    ``spark``: a SparkSession, or a function starting one when the push needs it. ``use_spark``:
    ``auto`` runs a push of SPARK_FILES files or more on Spark when ``spark`` is given, ``always``
    every push (a local session is started when ``spark`` is None), ``never`` none.
    """
    if use_spark not in SPARK_MODES:
        raise ConfigError(f"use_spark={use_spark!r}: expected one of {', '.join(SPARK_MODES)}")
    check_labels(what, where, work_id)
    sources = sorted(gather(paths, start, end), key=lambda s: (s.start, str(s.path)))
    storage.check_writable()
    session = _session_for(spark, use_spark, len(sources))
    if session is not None:
        from singerlake.files.spark_push import push_on_spark

        return push_on_spark(session, storage, sources, what=what, where=where, work_id=work_id, progress=progress)
    result = PushResult()
    seen: dict[str, dict] = {}
    done = 0
    for first in range(0, len(sources), COMMIT_FILES):
        chunk = sources[first : first + COMMIT_FILES]
        push_chunk(storage, chunk, what, where, work_id, result, seen)
        done += len(chunk)
        if progress:
            progress(done, len(sources))
    return result


def _session_for(spark: Any, use_spark: str, files: int):
    """The SparkSession a push of ``files`` files runs on, or None for the thread pool."""
    if use_spark == "never" or (use_spark == "auto" and (spark is None or files < SPARK_FILES)):
        return None
    if spark is None:
        from singerlake.spark.session import spark_session

        return spark_session(app_name="singerlake push")
    return spark if hasattr(spark, "createDataFrame") else spark()
