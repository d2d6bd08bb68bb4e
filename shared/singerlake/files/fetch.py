"""Fetch pushed files back (SPEC.md §14): streamed, never held in memory, hash checked before the
file gets its name (a temp file renamed), so a damaged or partial copy never looks like the file."""

from __future__ import annotations

import os
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from singerlake.errors import ConfigError, SingerlakeError
from singerlake.files import index
from singerlake.format.metadata import new_digest
from singerlake.storage import Storage

DEFAULT_NAME = "{id}-{name}"
CHUNK_BYTES = 1 << 20


class CorruptFile(SingerlakeError):
    pass


def record_of(storage: Storage, file_id: str) -> dict:
    record = index.committed_record(storage, file_id)
    if record is None:
        raise ConfigError(f"{file_id}: no file with this id in {storage.url} (`singerlake files` lists them)")
    return record


def copy_verified(storage: Storage, record: dict, out: BinaryIO) -> int:
    """Stream the file into ``out``; raise CorruptFile after the last byte if its hash is not the record's."""
    digest = new_digest()
    size = 0
    with storage.open_read(record["key"]) as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    if digest.hexdigest() != record["hash"] or size != record["size"]:
        raise CorruptFile(f"{storage.url_of(record['key'])}: its bytes do not match the record's hash/size (file {record['id']})")
    return size


def name_for(record: dict, template: str) -> Path:
    """A relative path from the record's fields; one that would leave the output directory is refused."""
    try:
        text = template.format_map(record)
    except (KeyError, ValueError, IndexError) as exc:
        raise ConfigError(f"--name {template!r}: {exc} is not a field of the record (id, what, where, name, start_iso, ...)") from None
    parts = text.split("/")
    if text.startswith("/") or any(part in ("", ".", "..") for part in parts) or "\0" in text:
        raise ConfigError(f"--name {template!r} gives {text!r} for {record['id']}: not a path inside the output directory")
    return Path(*parts)


def fetch_to_path(storage: Storage, record: dict, target: Path) -> int:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
    try:
        with open(tmp, "wb") as out:
            size = copy_verified(storage, record, out)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return size


def fetch(storage: Storage, records: list[dict], out: str | None, template: str = DEFAULT_NAME) -> list[tuple[dict, str]]:
    """Write each file: to stdout (``-``), to ``out`` as a file (one record, not a directory), or into
    the directory ``out`` (default: here) under ``template``. Returns (record, where it went)."""
    if out == "-":
        for record in records:
            copy_verified(storage, record, sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return [(record, "-") for record in records]
    if out and len(records) == 1 and not Path(out).is_dir() and not out.endswith("/"):
        fetch_to_path(storage, records[0], Path(out))
        return [(records[0], out)]
    directory = Path(out or ".")
    targets = [directory / name_for(record, template) for record in records]
    named: dict[Path, str] = {}
    for record, target in zip(records, targets, strict=True):
        if named.setdefault(target, record["id"]) != record["id"]:
            raise ConfigError(
                f"--name {template!r} gives {target} to both {named[target]} and {record['id']}: add {{id}} or {{name}} to it"
            )
    with ThreadPoolExecutor(storage.parallel_requests) as pool:  # many files: requests in flight side by side
        list(pool.map(lambda pair: fetch_to_path(storage, *pair), zip(records, targets, strict=True)))
    return [(record, str(target)) for record, target in zip(records, targets, strict=True)]
