"""The per-file datalake metadata record (SPEC.md §5), with Singerlake's extra fields."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from singerlake.format.errors import InvalidMetadata, NewerFormat
from singerlake.format.schema_hash import is_schema_hash

METADATA_VERSION = 0
_LABEL = re.compile(r"^[a-z0-9_-]+$")
LABEL_MAX = 64  # what, where and work_id become key segments (SPEC.md §14): kept short
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def check_spec_version(doc: dict, source: str, known: str) -> None:
    """Refuse a document written under a newer format than this reader knows (SPEC.md §13): what it
    added could be missed (1.1's gzip members were invisible to a 1.0 reader), so nothing of it is read."""
    written = doc.get("spec_version")
    if written is None:
        return  # 1.x manifests and parts carry no spec_version; their `format` tells them apart
    try:
        newer = tuple(int(n) for n in str(written).split(".")) > tuple(int(n) for n in known.split("."))
    except ValueError:
        raise InvalidMetadata(f"{source}: field 'spec_version' must look like '2.0', got {written!r}") from None
    if newer:
        raise NewerFormat(
            f"{source}: written under lake format {written}, newer than the {known} this Singerlake reads; "
            "upgrade singerlake (pip install -U singerlake) to read it"
        )


def new_digest():
    """An empty digest of the record's ``hash``: 16-byte blake2b, fed the stored bytes."""
    return hashlib.blake2b(digest_size=16)


def blake2_hex(data: bytes) -> str:
    """The record's ``hash`` of ``data``: the hex of its 16-byte blake2b digest."""
    digest = new_digest()
    digest.update(data)
    return digest.hexdigest()


def make_record(
    *,
    file_id: str,
    path: str,
    where: str,
    what: str,
    start: int,
    end: int,
    content_hash: str,
    size: int,
    records: int,
    schema_hash: str,
    work_id: str | None = None,
) -> dict[str, Any]:
    record = {
        "version": METADATA_VERSION,
        "id": file_id,
        "start": start,
        "end": end,
        "path": path,
        "where": where,
        "what": what,
        "work_id": work_id,
        "hash": content_hash,
        "size": size,
        "records": records,
        "schema_hash": schema_hash,
    }
    validate_record(record)
    return record


def label_problem(field: str, value: Any) -> str | None:
    """Why ``value`` cannot be a what, where or work_id (None when it can); the one rule for labels."""
    if field == "work_id" and value == "null":
        return 'must be null, not the string "null"'
    if not isinstance(value, str) or not _LABEL.match(value) or len(value) > LABEL_MAX:
        return f"must match ^[a-z0-9_-]+$ (at most {LABEL_MAX} characters), got {value!r}"
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_record(record: Any, where_from: str = "metadata record") -> None:
    """Raise InvalidMetadata naming the first field at fault."""

    def fail(field: str, problem: str) -> None:
        raise InvalidMetadata(f"{where_from}: field {field!r} {problem}")

    if not isinstance(record, dict):
        raise InvalidMetadata(f"{where_from}: must be a JSON object, got {type(record).__name__}")
    required = ("version", "id", "start", "end", "path", "where", "what", "work_id", "hash", "size", "records", "schema_hash")
    for field in required:
        if field not in record:
            fail(field, "is missing")
    if not _is_int(record["version"]) or record["version"] != METADATA_VERSION:
        fail("version", f"must be {METADATA_VERSION}, got {record['version']!r}")
    if not isinstance(record["id"], str) or not _HEX32.match(record["id"]):
        fail("id", f"must be 32 lower-case hex digits (a uuid), got {record['id']!r}")
    for field in ("start", "end", "size", "records"):
        if not _is_int(record[field]) or record[field] < 0:
            fail(field, f"must be a non-negative integer, got {record[field]!r}")
    if record["end"] < record["start"]:
        fail("end", f"({record['end']}) is before start ({record['start']})")
    if not isinstance(record["path"], str) or not record["path"]:
        fail("path", f"must be a non-empty string, got {record['path']!r}")
    for field in ("where", "what"):
        if not isinstance(record[field], str) or not _LABEL.match(record[field]):
            fail(field, f"must match ^[a-z0-9_-]+$, got {record[field]!r}")
    work_id = record["work_id"]
    if work_id is not None:
        if work_id == "null":
            fail("work_id", 'must be null, not the string "null"')
        if not isinstance(work_id, str) or not _LABEL.match(work_id):
            fail("work_id", f"must be null or match ^[a-z0-9_-]+$, got {work_id!r}")
    if not isinstance(record["hash"], str) or not _HEX32.match(record["hash"]):
        fail("hash", f"must be a 16-byte blake2b digest in hex, got {record['hash']!r}")
    if not isinstance(record["schema_hash"], str) or not is_schema_hash(record["schema_hash"]):
        fail("schema_hash", f"must be a 13-digit schema hash, got {record['schema_hash']!r}")
