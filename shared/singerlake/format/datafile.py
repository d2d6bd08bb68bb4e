"""Data files: gzip of Singer messages, SCHEMA first, RECORD lines byte-for-byte as received (SPEC.md §4)."""

from __future__ import annotations

import io
import json
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

from isal import igzip, isal_zlib

from singerlake.format.errors import CorruptFile
from singerlake.format.layout import StreamPaths
from singerlake.format.metadata import blake2_hex, make_record, new_digest
from singerlake.format.names import normalise_label
from singerlake.format.needs import FileNeeds, properties_of
from singerlake.storage import NotFound, PreconditionFailed, Storage
from singerlake.times import new_file_id

DEFAULT_COMPRESSLEVEL = 6
CHUNK = 1 << 20
SPOOL_IN_MEMORY = 16 << 20  # remote files larger than this are spooled to a temp file while verified
GZIP_ERRORS = (OSError, EOFError, zlib.error, isal_zlib.error)  # what damaged gzip raises while read


def corrupt_gzip(name: str, exc: Exception) -> CorruptFile:
    return CorruptFile(f"{name}: corrupt or truncated gzip: {exc}")


# -- writing: a data file is one or more gzip members, appended ---------------------------------------
def member_compressor(compresslevel: int = DEFAULT_COMPRESSLEVEL):
    """A compressor whose output, flushed, is one complete gzip member (mtime 0, no name)."""
    return zlib.compressobj(compresslevel, zlib.DEFLATED, 31)


def gzip_member(data: bytes | bytearray, compresslevel: int = DEFAULT_COMPRESSLEVEL) -> bytes:
    """``data`` as one gzip member: equal input, equal bytes."""
    compressor = member_compressor(compresslevel)
    return compressor.compress(data) + compressor.flush()


def encode(lines: Iterable[bytes], compresslevel: int = DEFAULT_COMPRESSLEVEL) -> bytes:
    """A whole data file of one message per line, as one gzip member."""
    return gzip_member(b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines), compresslevel)


# -- reading: by ISA-L's gzip (isal), 2-3x zlib's speed, the same bytes --------------------------------


def iter_lines(stream: BinaryIO, name: str) -> Iterator[bytes]:
    """Stream the lines of a data file without loading it whole."""
    try:
        with igzip.GzipFile(fileobj=stream, mode="rb") as unzipped:
            reader = io.BufferedReader(unzipped, buffer_size=1 << 20)
            yield from reader
    except GZIP_ERRORS as exc:
        raise corrupt_gzip(name, exc) from exc


def open_verified(storage: Storage, entry: dict) -> BinaryIO:
    """The stored bytes of a data file, checked against the manifest's size and blake2 hash first,
    so not one record of a damaged file is emitted. Seekable sources are hashed in place; remote
    ones are spooled (to disk when large) while hashed: memory stays flat either way."""
    name = storage.url_of(entry["path"])
    try:
        source = storage.open_read(entry["path"])
    except NotFound:
        raise CorruptFile(f"{name}: missing from storage, though the manifest lists it") from None
    target = source if _is_local_file(source) else tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)
    try:
        digest, size = new_digest(), 0
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if target is not source:
                target.write(chunk)
        check_stored(name, entry, size, digest.hexdigest())
        target.seek(0)
        return target
    except BaseException:
        target.close()
        raise
    finally:
        if target is not source:
            source.close()


def _is_local_file(source: BinaryIO) -> bool:
    """Local files are hashed, then re-read from the start; a remote object is downloaded only once."""
    try:
        source.fileno()
        return True
    except (OSError, io.UnsupportedOperation):
        return False


@contextmanager
def open_data_file(storage: Storage, entry: dict) -> Iterator[BinaryIO]:
    """A data file's messages, unzipped, after its bytes were checked against its manifest entry; a
    damaged file raises CorruptFile naming it, before or while it is read."""
    with open_verified(storage, entry) as stored, igzip.GzipFile(fileobj=stored, mode="rb") as unzipped:
        try:
            yield unzipped
        except GZIP_ERRORS as exc:
            raise corrupt_gzip(storage.url_of(entry["path"]), exc) from exc


def check_stored(name: str, entry: dict, size: int, digest: str) -> None:
    """CorruptFile unless a data file's stored bytes have the manifest's size and blake2 hash."""
    if size != entry["size"]:
        raise CorruptFile(f"{name}: size is {size} bytes, the manifest says {entry['size']} (truncated or replaced)")
    if digest != entry["hash"]:
        raise CorruptFile(f"{name}: blake2 hash {digest} differs from the manifest's {entry['hash']}")


def read_data_file(storage: Storage, entry: dict) -> bytes:
    """A data file's messages, unzipped in one call (three times the streaming reader's speed, for a
    reader that holds them all anyway), after its bytes were checked as ``open_data_file`` does: read
    whole, in one request."""
    name = storage.url_of(entry["path"])
    try:
        stored = storage.read(entry["path"]).data
    except NotFound:
        raise CorruptFile(f"{name}: missing from storage, though the manifest lists it") from None
    digest = new_digest()
    digest.update(stored)
    check_stored(name, entry, len(stored), digest.hexdigest())
    try:
        return igzip.decompress(stored)
    except GZIP_ERRORS as exc:
        raise corrupt_gzip(name, exc) from exc


@dataclass
class FileSummary:
    """What a scan learns from a data file's content."""

    schema_message: dict
    records: int


def summarise(data: bytes, name: str) -> FileSummary:
    lines = iter_lines(io.BytesIO(data), name)
    try:
        schema = json.loads(next(lines))
    except StopIteration:
        raise CorruptFile(f"{name}: empty data file") from None
    except json.JSONDecodeError as exc:
        raise CorruptFile(f"{name}: line 1 is not JSON: {exc}") from None
    if not isinstance(schema, dict) or schema.get("type") != "SCHEMA":
        raise CorruptFile(f"{name}: line 1 is not a SCHEMA message")
    return FileSummary(schema, sum(1 for line in lines if line.strip()))


def write_data_file(
    storage: Storage,
    paths: StreamPaths,
    schema_hash: str,
    schema_line: bytes,
    record_lines: list[bytes],
    times_ms: list[int],
    *,
    work_id: str | None = None,
    compresslevel: int = DEFAULT_COMPRESSLEVEL,
) -> dict:
    """Write one data file (create-only, never overwriting) and return its metadata record.

    The file is invisible to readers until a commit adds the returned record to the manifest.
    """
    if not record_lines or len(record_lines) != len(times_ms):
        raise ValueError("a data file needs at least one record and one time per record")
    if min(times_ms) < 0:
        raise ValueError(f"record times must be ms since 1970, got {min(times_ms)}")
    data = encode([schema_line, *record_lines], compresslevel)
    record = store(storage, paths, schema_hash, data, min(times_ms), max(times_ms), len(record_lines), work_id)
    needs = FileNeeds(properties_of(json.loads(schema_line).get("schema")))
    needs.add_lines(b"".join(line if line.endswith(b"\n") else line + b"\n" for line in record_lines))
    return {**record, **needs.fields()}


def store(
    storage: Storage,
    paths: StreamPaths,
    schema_hash: str,
    data: bytes,
    start: int,
    end: int,
    records: int,
    work_id: str | None,
    file_id: str | None = None,
) -> dict:
    """Write encoded data file bytes (create-only) and return the file's metadata record.

    ``file_id``: named by whoever knows the record order (a new id, by default). Storing the same
    bytes under a given id twice is fine: a retried Spark task finds its earlier attempt's file.
    """
    retry_safe = file_id is not None
    file_id = file_id or new_file_id()
    key = paths.data_file(schema_hash, start, end, file_id)
    try:
        storage.write(key, data, if_none_match=True)
    except PreconditionFailed:
        if not retry_safe or storage.read(key).data != data:
            raise
    return make_record(
        file_id=file_id,
        path=key,
        where=normalise_label(paths.tap_id),
        what=normalise_label(paths.stream),
        start=start,
        end=end,
        content_hash=blake2_hex(data),
        size=len(data),
        records=records,
        schema_hash=schema_hash,
        work_id=work_id,
    )
