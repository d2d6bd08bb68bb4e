"""Data files: gzip of Singer messages, SCHEMA first, RECORD lines byte-for-byte as received (SPEC.md §4)."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import BinaryIO

from singerlake.errors import SingerlakeError
from singerlake.metadata import blake2_hex, make_record
from singerlake.paths import StreamPaths, new_file_id, normalise_label, to_ms
from singerlake.storage import PreconditionFailed, Storage

DEFAULT_COMPRESSLEVEL = 6


class CorruptFile(SingerlakeError, ValueError):
    """A data file that cannot be read back; the message names the file."""


def parse_time_ms(value: object) -> int | None:
    """ISO 8601 / RFC 3339 text to ms since the epoch (naive means UTC); None when unparsable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        # A trailing Z spelled as an offset: Python 3.10's fromisoformat (still supported) rejects "Z".
        dt = datetime.fromisoformat(value[:-1] + "+00:00" if value[-1] in "Zz" else value)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    ms = to_ms(dt)
    return ms if ms >= 0 else None  # start/end are ms since the epoch (SPEC.md §5): earlier is unusable


def record_time_ms(message: dict, received_ms: int | None) -> int | None:
    """The time a record is filed under: ``time_extracted``, else ``_sdc_extracted_at``, else receipt."""
    found = parse_time_ms(message.get("time_extracted"))
    if found is None and isinstance(message.get("record"), dict):
        found = parse_time_ms(message["record"].get("_sdc_extracted_at"))
    return received_ms if found is None else found


def encode(lines: Iterable[bytes], compresslevel: int = DEFAULT_COMPRESSLEVEL) -> bytes:
    """Gzip one message per line; mtime 0 and no file name, so equal input gives equal bytes."""
    body = b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines)
    return gzip.compress(body, compresslevel=compresslevel, mtime=0)


def iter_lines(stream: BinaryIO, name: str) -> Iterator[bytes]:
    """Stream the lines of a data file without loading it whole."""
    try:
        with gzip.GzipFile(fileobj=stream, mode="rb") as unzipped:
            reader = io.BufferedReader(unzipped, buffer_size=1 << 20)
            yield from reader
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise CorruptFile(f"{name}: corrupt or truncated gzip: {exc}") from exc


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
    return store(storage, paths, schema_hash, data, min(times_ms), max(times_ms), len(record_lines), work_id)


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
