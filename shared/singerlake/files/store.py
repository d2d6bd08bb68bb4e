"""One pushed file stored, and one chunk of them committed (SPEC.md §14-§15): the threaded push
and the executors of a Spark push (``spark_push``) both store files so.

A small file is read once into memory; a large file is read twice, a first time for its hash (its
id, hence its key) and a second time streamed to storage and hashed again, so a file that changed
in between stores nothing. A chunk commits as one segment, under its lease: visible whole or not at all.
"""

from __future__ import annotations

import functools
import json
import os
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from singerlake.errors import ConfigError
from singerlake.files import index, layout
from singerlake.files.errors import Aborted, FileChanged, PushAborted
from singerlake.files.lease import push_leases
from singerlake.files.record import content_type, file_id, make_record
from singerlake.format.metadata import new_digest
from singerlake.storage import PreconditionFailed, Storage
from singerlake.text import counted
from singerlake.times import new_file_id

SMALL_BYTES = 4 << 20  # read whole: one request per file, bounded memory per thread
CHUNK_BYTES = 1 << 20
COMMIT_FILES = 10_000  # records per segment: a day's query reads segments of bounded size
ATTEMPTS = 3  # a chunk whose txn a vacuum aborted is stored again, under a new txn, this many times in all


@dataclass(frozen=True)
class Source:
    path: Path
    size: int
    mtime_ns: int
    start: int
    end: int | None


@dataclass
class PushResult:
    pushed: list[dict] = field(default_factory=list)  # records committed whose bytes this push stored
    # Already in the lake: the records found there, or committed here too when another push (racing
    # this one, or killed) had stored the bytes: that push reports them pushed if it commits.
    duplicates: list[dict] = field(default_factory=list)
    spark: dict | None = None  # a push run on Spark: {"jobs", "tasks", "worker_processes"}
    stored_here: set[str] = field(default_factory=set, repr=False)  # ids whose bytes this push stored

    def to_dict(self) -> dict:
        doc = {"pushed": self.pushed, "duplicates": self.duplicates}
        if self.spark is not None:
            doc["spark"] = self.spark
        return doc

    def commit_chunk(self, storage: Storage, what: str, txn: str, stored: list[tuple[dict, bool | None]], seen: dict[str, dict]) -> None:
        """Commit one chunk's newly stored records as segment ``txn``; a file already in the lake, or
        met before in this push (``seen``: the records committed so far, by id), is a duplicate. Nothing
        is counted unless the commit succeeds (a chunk a vacuum aborted is stored and committed again).

        ``stored`` pairs each record with ``store``'s answer: True already committed, False its bytes
        stored by this push, None its bytes found but not committed. Only the push that stored the
        bytes (create-only: one push) reports a file pushed, so pushes racing on the same files report
        each one pushed once between them; a None file is committed here too, lest that push never
        commit it, and reported already in the lake unless this push stored it (``stored_here``: in an
        earlier chunk of a Spark push, or an attempt a vacuum aborted)."""
        self.stored_here |= {record["id"] for record, duplicate in stored if duplicate is False}
        fresh: dict[str, dict] = {}
        duplicates: list[dict] = []
        for record, duplicate in stored:
            if not duplicate and record["id"] in seen and record["txn"] != seen[record["id"]]["txn"]:
                # Stored at once with an earlier chunk (a Spark push): its record file may name this
                # chunk's txn, which does not hold it; it names the committed one again.
                committed = seen[record["id"]]
                storage.write(
                    layout.record_key(record["id"]), json.dumps(committed, separators=(",", ":")).encode(), content_type="application/json"
                )
            if duplicate or record["id"] in fresh or record["id"] in seen:
                duplicates.append(record)
            else:
                fresh[record["id"]] = record
        if fresh:
            index.commit(storage, what, txn, list(fresh.values()))
            for record in fresh.values():
                (self.pushed if record["id"] in self.stored_here else self.duplicates).append(record)
            seen.update(fresh)
        self.duplicates.extend(duplicates)


def push_chunk(
    storage: Storage, chunk: list[Source], what: str, where: str, work_id: str | None, result: PushResult, seen: dict[str, dict]
) -> None:
    """Store and commit one chunk under its lease (SPEC.md §15); a chunk a vacuum aborted is stored
    again under a new txn (its bytes anew where the vacuum deleted them)."""
    with ThreadPoolExecutor(storage.parallel_requests) as pool:
        for _ in range(ATTEMPTS):
            txn = new_file_id()
            with push_leases(storage, what, [txn]):
                stored = list(pool.map(functools.partial(_store_in, storage, what, where, work_id, txn), chunk))
                try:
                    result.commit_chunk(storage, what, txn, stored, seen)
                    return
                except Aborted:
                    continue
    raise PushAborted(
        f"{counted(len(chunk), 'file')} into {what!r} aborted {ATTEMPTS} times by vacuums running meanwhile; nothing of them was committed"
    )


def _store_in(storage: Storage, what: str, where: str, work_id: str | None, txn: str, source: Source) -> tuple[dict, bool | None]:
    return store(storage, source, what, where, work_id, txn)


def store(storage: Storage, source: Source, what: str, where: str, work_id: str | None, txn: str) -> tuple[dict, bool | None]:
    """Store one file's bytes and record: (the committed record, True) when the lake already holds it,
    else (its record, False) when this push stored the bytes, (its record, None) when they were there
    already but not committed (stored by a push racing this one, or killed)."""
    if source.size <= SMALL_BYTES:
        data = _read_whole(source)
        digest = new_digest()
        digest.update(data)
        content_hash = digest.hexdigest()
        key = layout.data_key(what, where, file_id(what, where, content_hash))
        try:
            storage.write(key, data, if_none_match=True, durable=False, content_type=content_type(source.path.name))
            existed = False
        except PreconditionFailed:
            existed = True
    else:
        content_hash = _hash_of(source)
        key = layout.data_key(what, where, file_id(what, where, content_hash))
        existed = storage.exists(key)
        if not existed:
            try:
                chunks = _verified_chunks(source, content_hash)
                storage.write_stream(key, chunks, if_none_match=True, content_type=content_type(source.path.name))
            except PreconditionFailed:
                existed = True  # another push stored the same bytes meanwhile
    fid = file_id(what, where, content_hash)
    if existed:
        found = index.committed_record(storage, fid)
        if found is not None:
            return found, True
    record = make_record(
        what=what, where=where, work_id=work_id, start=source.start, end=source.end, path=str(source.path),
        name=source.path.name, content_hash=content_hash, size=source.size, txn=txn,
    )  # fmt: skip
    body = json.dumps(record, separators=(",", ":")).encode()
    storage.write(layout.record_key(fid), body, durable=False, content_type="application/json")  # synced at the commit
    return record, None if existed else False


def _changed(source: Source, why: str) -> FileChanged:
    return FileChanged(f"{source.path}: changed while it was pushed ({why}); nothing of it was stored, push it again")


def _open(source: Source) -> BinaryIO:
    """The file, still a regular one: never a FIFO or device put in its place since it was gathered."""
    handle = os.fdopen(os.open(source.path, os.O_RDONLY | os.O_NONBLOCK), "rb")
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        handle.close()
        raise _changed(source, "no longer a regular file")
    return handle


def _read_whole(source: Source) -> bytes:
    try:
        with _open(source) as handle:
            data = handle.read(source.size + 1)  # never more: a file longer than its size does not fill the memory
            info = os.fstat(handle.fileno())
    except OSError as exc:
        raise unreadable(source.path, exc) from None
    _check_read(source, len(data), info)
    return data


def _check_read(source: Source, size: int, info: os.stat_result) -> None:
    """A file read whole: it changed if its size or mtime did, it lies if it held other than its size."""
    if info.st_size != source.size or info.st_mtime_ns != source.mtime_ns:
        raise _changed(source, "size or mtime")
    if size != source.size:
        raise size_lies(source.path, source.size)


def _hash_of(source: Source) -> str:
    digest = new_digest()
    for chunk in _chunks(source):
        digest.update(chunk)
    return digest.hexdigest()


def _chunks(source: Source) -> Iterator[bytes]:
    size = 0
    try:
        with _open(source) as handle:
            while size <= source.size and (chunk := handle.read(CHUNK_BYTES)):  # past its size: it grew, or lies
                size += len(chunk)
                yield chunk
            info = os.fstat(handle.fileno())
    except OSError as exc:
        raise unreadable(source.path, exc) from None
    _check_read(source, size, info)


def _verified_chunks(source: Source, expected_hash: str) -> Iterator[bytes]:
    """The file again, raising before the last chunk is accepted if its bytes are not the ones hashed."""
    digest = new_digest()
    for chunk in _chunks(source):
        digest.update(chunk)
        yield chunk
    if digest.hexdigest() != expected_hash:
        raise _changed(source, "content")


def unreadable(path: Path, exc: OSError) -> ConfigError:
    return ConfigError(f"{path}: cannot read it: {exc.strerror or exc}")


def size_lies(path: Path, size: int) -> ConfigError:
    return ConfigError(
        f"{path}: its size ({counted(size, 'byte')}) is not what it holds (a /proc or /sys file, or one being written): push a copy"
    )
