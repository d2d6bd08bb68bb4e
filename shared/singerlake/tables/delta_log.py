"""A Delta table's log read and written directly (SPEC.md §12): a project run's cost does not grow
with the table's history.

    _delta_log/<version:020>.json                  one commit: newline-delimited actions
    _delta_log/<version:020>.checkpoint.parquet    the table as of that version (its actions replayed)
    _delta_log/_last_checkpoint                    {"version": ...} of the latest checkpoint

The latest version is found from ``_last_checkpoint`` and one listing of the log after it; a
commit is one create-only write of the next version. Every ``CHECKPOINT_INTERVAL`` versions the
committer writes a checkpoint: the previous one replayed with the commits since (at most that many
log entries, each read once), in the schema delta-rs gives its own checkpoints, so readers load the
table from it.
"""

from __future__ import annotations

import io
import json
import re
import time
from dataclasses import dataclass

from singerlake.commits.errors import CommitRejected
from singerlake.storage import NotFound, PreconditionFailed, Storage

LAST_CHECKPOINT = "_last_checkpoint"
COMMIT_NAME = re.compile(r"\d{20}\.json")
CHECKPOINT_INTERVAL = 6  # a reader replays at most this many log entries; a checkpoint run reads that many more
TOMBSTONE_RETENTION_MS = 7 * 24 * 3600 * 1000  # Delta's delta.deletedFileRetentionDuration default: removes kept that long


@dataclass
class Head:
    """Where the log stands: its latest version and its latest checkpoint's (None: none)."""

    version: int | None
    checkpoint: int | None = None


def log_key(key: str, version: int) -> str:
    return f"{key}/_delta_log/{version:020d}.json"


def checkpoint_key(key: str, version: int) -> str:
    return f"{key}/_delta_log/{version:020d}.checkpoint.parquet"


def last_checkpoint(storage: Storage, key: str) -> int | None:
    """The version ``_last_checkpoint`` names (None: none, or unreadable)."""
    try:
        checkpoint = json.loads(storage.read(f"{key}/_delta_log/{LAST_CHECKPOINT}").data)["version"]
    except (NotFound, ValueError, KeyError, TypeError):
        return None
    return checkpoint if isinstance(checkpoint, int) and not isinstance(checkpoint, bool) else None


def head(storage: Storage, key: str) -> Head:
    """The latest version: ``_last_checkpoint``, then one listing of the log from that checkpoint on."""
    log = f"{key}/_delta_log/"
    checkpoint = last_checkpoint(storage, key)
    for start_after in ([f"{log}{checkpoint:020d}"] if checkpoint is not None else []) + [None]:
        names = [info.key[len(log) :] for info in storage.list(log, start_after)]
        versions = [int(name[:20]) for name in names if COMMIT_NAME.fullmatch(name)]
        if versions:
            return Head(max(versions), checkpoint if start_after else None)
    return Head(None)


def committed(storage: Storage, key: str, version: int) -> bool:
    """Whether version ``version`` exists (one existence check of its log entry)."""
    return storage.exists(log_key(key, version))


def read_actions(storage: Storage, key: str, version: int) -> list[dict] | None:
    """The actions of one version, or None when its log entry is gone."""
    try:
        data = storage.read(log_key(key, version)).data
    except NotFound:
        return None
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def write(storage: Storage, key: str, version: int, actions: list[dict]) -> None:
    """Version ``version``, create-only (the Delta protocol's mutual exclusion): when another writer
    took that version first, CommitRejected and nothing is written."""
    body = "".join(json.dumps(action, separators=(",", ":")) + "\n" for action in actions).encode()
    try:
        storage.write(log_key(key, version), body, if_none_match=True)
    except PreconditionFailed:
        raise CommitRejected(f"{storage.url_of(key)}: version {version} was committed by another writer first") from None


def checkpoint_due(version: int) -> bool:
    return (version + 1) % CHECKPOINT_INTERVAL == 0  # the versions delta-rs would pick for the same interval


def due_checkpoint_at_or_below(version: int) -> int | None:
    """The latest version at or below ``version`` whose committer writes a checkpoint (it may have died first)."""
    due = (version + 1) // CHECKPOINT_INTERVAL * CHECKPOINT_INTERVAL - 1
    return due if due >= 0 else None


def write_checkpoint(storage: Storage, key: str, version: int, since: Head, actions: list[dict]) -> None:
    """The checkpoint of ``version`` (whose ``actions`` the caller just wrote): the checkpoint ``since``
    names replayed with the log entries after it, tombstones younger than Delta's retention kept."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    replayed: dict[str, dict] = {}  # "protocol", "metaData", "add:<path>", "remove:<path>", "txn:<app>"
    checkpoint, stored = _stored_checkpoint(storage, key, since.checkpoint)
    if stored is not None:
        for action in pq.read_table(io.BytesIO(stored)).to_pylist():
            _apply(replayed, {kind: _from_parquet(value) for kind, value in action.items() if value is not None})
        first = checkpoint + 1
    else:
        first = 0
    for earlier in range(first, version):
        entry = read_actions(storage, key, earlier)
        if entry is None:
            raise NotFound(f"{storage.url_of(log_key(key, earlier))} is gone: no checkpoint of version {version} written")
        for action in entry:
            _apply(replayed, action)
    for action in actions:
        _apply(replayed, action)
    horizon = int(time.time() * 1000) - TOMBSTONE_RETENTION_MS
    rows = [
        {kind: _to_parquet(value)}
        for name, action in replayed.items()
        for kind, value in action.items()
        if not (kind == "remove" and (value.get("deletionTimestamp") or 0) < horizon)
    ]
    table = pa.Table.from_pylist(rows, schema=checkpoint_schema())
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="snappy")
    storage.write(checkpoint_key(key, version), buffer.getvalue())
    adds = sum(1 for row in rows if "add" in row)
    last = {"version": version, "size": len(rows), "sizeInBytes": len(buffer.getvalue()), "numOfAddFiles": adds}
    storage.write(f"{key}/_delta_log/{LAST_CHECKPOINT}", json.dumps(last).encode())


def _stored_checkpoint(storage: Storage, key: str, checkpoint: int | None) -> tuple[int | None, bytes | None]:
    """(version, bytes) of checkpoint ``checkpoint``; when it is missing (its committer died before writing it),
    of the one ``_last_checkpoint`` names; (None, None): none, the log is replayed from version 0."""
    if checkpoint is None:
        return None, None
    try:
        return checkpoint, storage.read(checkpoint_key(key, checkpoint)).data
    except NotFound:
        named = last_checkpoint(storage, key)
    if named is None or named == checkpoint:
        return None, None
    try:
        return named, storage.read(checkpoint_key(key, named)).data
    except NotFound:
        return None, None


def _apply(replayed: dict[str, dict], action: dict) -> None:
    """One action replayed (Delta's rules: the latest protocol and metadata; an add or remove of a path
    replaces the other; commitInfo is not kept)."""
    for kind, value in action.items():
        if kind in ("protocol", "metaData"):
            replayed[kind] = {kind: value}
        elif kind in ("add", "remove"):
            replayed.pop(f"add:{value['path']}", None)
            replayed.pop(f"remove:{value['path']}", None)
            replayed[f"{kind}:{value['path']}"] = {kind: value}
        elif kind == "txn":
            replayed[f"txn:{value['appId']}"] = {kind: value}


MAPS = ("partitionValues", "tags", "options", "configuration")


def _from_parquet(value):
    """A checkpoint row's struct as the log's JSON has it (maps as objects)."""
    if isinstance(value, dict):
        return {name: dict(part) if name in MAPS and isinstance(part, list) else _from_parquet(part) for name, part in value.items()}
    return value


def _to_parquet(value):
    """An action as a checkpoint row's struct (maps as key-value pairs)."""
    if isinstance(value, dict):
        return {name: list(part.items()) if name in MAPS and isinstance(part, dict) else _to_parquet(part) for name, part in value.items()}
    return value


def checkpoint_schema():
    """The columns delta-rs writes in its checkpoints (protocol 1/2: no deletion vectors or row ids)."""
    import pyarrow as pa

    strings = lambda name: pa.map_(pa.string(), pa.string())  # noqa: E731
    add = pa.struct(
        [
            pa.field("path", pa.string(), False),
            pa.field("partitionValues", strings("partitionValues"), False),
            pa.field("size", pa.int64(), False),
            pa.field("modificationTime", pa.int64(), False),
            pa.field("dataChange", pa.bool_(), False),
            pa.field("stats", pa.string()),
            pa.field("tags", strings("tags")),
        ]
    )
    remove = pa.struct(
        [
            pa.field("path", pa.string(), False),
            pa.field("deletionTimestamp", pa.int64()),
            pa.field("dataChange", pa.bool_(), False),
            pa.field("extendedFileMetadata", pa.bool_()),
            pa.field("partitionValues", strings("partitionValues")),
            pa.field("size", pa.int64()),
            pa.field("stats", pa.string()),
            pa.field("tags", strings("tags")),
        ]
    )
    file_format = pa.struct([pa.field("provider", pa.string(), False), pa.field("options", strings("options"), False)])
    metadata = pa.struct(
        [
            pa.field("id", pa.string(), False),
            pa.field("name", pa.string()),
            pa.field("description", pa.string()),
            pa.field("format", file_format, False),
            pa.field("schemaString", pa.string(), False),
            pa.field("partitionColumns", pa.list_(pa.field("element", pa.string(), False)), False),
            pa.field("createdTime", pa.int64()),
            pa.field("configuration", strings("configuration"), False),
        ]
    )
    protocol = pa.struct(
        [
            pa.field("minReaderVersion", pa.int32(), False),
            pa.field("minWriterVersion", pa.int32(), False),
            pa.field("readerFeatures", pa.list_(pa.field("element", pa.string(), False))),
            pa.field("writerFeatures", pa.list_(pa.field("element", pa.string(), False))),
        ]
    )
    txn = pa.struct([pa.field("appId", pa.string(), False), pa.field("version", pa.int64(), False), pa.field("lastUpdated", pa.int64())])
    return pa.schema([("add", add), ("remove", remove), ("metaData", metadata), ("protocol", protocol), ("txn", txn)])
