"""The metadata record of a pushed file (SPEC.md §14): the datalake's fields, plus size, name, type."""

from __future__ import annotations

import hashlib
import mimetypes
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any

from singerlake.errors import BadArgument, ConfigError
from singerlake.files.layout import data_key
from singerlake.format.metadata import METADATA_VERSION, label_problem
from singerlake.times import iso_ms, now_ms


def check_labels(what: str, where: str | None = None, work_id: str | None = None) -> None:
    """Refuse a label that breaks datalake's rule, naming the argument (None: not given; a where may be a prefix)."""
    for field, value in (("what", what), ("where", where), ("work_id", work_id)):
        if value is None and field != "what":
            continue
        problem = label_problem(field, value)
        if problem:
            raise BadArgument(field, problem)


def whats_of(what: str | Iterable[str]) -> list[str]:
    """The whats asked for: a name, several separated by commas (spaces around them ignored), or a list; each once."""
    names = what.split(",") if isinstance(what, str) else list(what)
    whats = list(dict.fromkeys(name.strip() if isinstance(name, str) else name for name in names))
    whats = [name for name in whats if name != ""]
    if not whats:
        raise BadArgument("what", f"no what in {what!r}")
    return whats


def check_span(start: int, end: int | None, source: str) -> None:
    if end is not None and end < start:
        raise ConfigError(f"{source}: end ({iso_ms(end)}) is before start ({iso_ms(start)})")


def file_id(what: str, where: str, content_hash: str) -> str:
    """Same bytes under the same what and where, same id: a second push is found, not stored again."""
    return hashlib.blake2b(f"{what}\0{where}\0{content_hash}".encode(), digest_size=16).hexdigest()


COMMON_TYPES = {  # before Python's mimetypes, which lacks some and may differ by machine (/etc/mime.types)
    **dict.fromkeys((".log", ".txt", ".text", ".out", ".err", ".conf", ".cfg", ".ini", ".env"), "text/plain"),
    ".csv": "text/csv",
    ".tsv": "text/tab-separated-values",
    ".md": "text/markdown",
    ".html": "text/html",
    ".json": "application/json",
    ".jsonl": "application/jsonl",
    ".ndjson": "application/x-ndjson",
    ".xml": "application/xml",
    **dict.fromkeys((".yaml", ".yml"), "application/yaml"),
    ".toml": "application/toml",
    ".sql": "application/sql",
    ".parquet": "application/vnd.apache.parquet",
    ".avro": "application/avro",
    ".pdf": "application/pdf",
    # a compressed file is its compression's type, whatever it holds: these are its bytes
    **dict.fromkeys((".gz", ".tgz"), "application/gzip"),
    ".bz2": "application/x-bzip2",
    ".xz": "application/x-xz",
    ".zst": "application/zstd",
    ".lz4": "application/x-lz4",
    ".zip": "application/zip",
    ".tar": "application/x-tar",
}


def content_type(name: str) -> str:
    """The media type of a file by its name (SPEC.md §14); a rotated file (``app.log.1``) as its kind."""
    suffixes = [suffix.lower() for suffix in PurePosixPath(name).suffixes]
    while suffixes and suffixes[-1][1:].isdigit():
        suffixes.pop()
    suffix = suffixes[-1] if suffixes else ""
    if suffix in COMMON_TYPES:
        return COMMON_TYPES[suffix]
    guessed, encoding = mimetypes.guess_type("file" + suffix, strict=False)
    return guessed if guessed and not encoding else "application/octet-stream"


def make_record(
    *, what: str, where: str, work_id: str | None, start: int, end: int | None, path: str, name: str, content_hash: str, size: int, txn: str
) -> dict[str, Any]:
    fid = file_id(what, where, content_hash)
    return {
        "version": METADATA_VERSION,
        "id": fid,
        "hash": content_hash,
        "start": start,
        "end": end,
        "start_iso": iso_ms(start),
        "end_iso": None if end is None else iso_ms(end),
        "path": path,
        "where": where,
        "what": what,
        "work_id": work_id,
        "size": size,
        "name": name,
        "content_type": content_type(name),
        "key": data_key(what, where, fid),
        "txn": txn,
        "created": iso_ms(now_ms()),
    }


def last_time(record: dict) -> int:
    """The time a file's data reaches: ``end``, or ``start`` for an instant."""
    return record["start"] if record["end"] is None else record["end"]


def newness(record: dict) -> tuple:
    """How --latest orders files: the newest data first, then the latest push."""
    return (last_time(record), record.get("created") or "", record["id"])


def overlaps(record: dict, start: int, end: int) -> bool:
    return record["start"] <= end and last_time(record) >= start


def singer_record(entry: dict, tap_id: str, stream: str) -> dict[str, Any]:
    """A Singer data file's manifest entry (SPEC.md §5) as a files record: where = the tap, what = the
    stream (normalised), its key the data file's; plus the stream's original names and its commit."""
    return {
        **{k: v for k, v in entry.items() if k != "runs"},
        "start_iso": iso_ms(entry["start"]),
        "end_iso": iso_ms(entry["end"]),
        "name": entry["path"].rsplit("/", 1)[-1],
        "content_type": "application/gzip",
        "key": entry["path"],
        "tap_id": tap_id,
        "stream": stream,
    }
