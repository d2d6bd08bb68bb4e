"""The published Delta Lake tables (SPEC.md §12), through delta-rs (the ``deltalake`` package).

Executors write the Parquet files through the lake's storage; the driver commits them here as one
transaction per project run. The commit's ``commitInfo`` carries the run's state under
``singerlake`` (position, column types, parts), so the table itself says what it holds: there is
no second file to keep in step with it.
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from dataclasses import dataclass
from typing import Any

from singerlake.commits.errors import CommitRejected
from singerlake.format.names import encode_segment
from singerlake.storage import LocalStorage, S3Storage, Storage
from singerlake.tables import delta_log

STATE_KEY = "singerlake"
TABLE_CONFIGURATION = {"delta.checkpointInterval": str(delta_log.CHECKPOINT_INTERVAL)}  # delta-rs's own commits keep the same pace
CLIENT = "singerlake"
# A state's parts list longer than this (as JSON text) is stored compressed: every Delta reader parses
# the whole of each log entry it replays, commitInfo included, so a table of many parts cost every
# query planning its state (200 KB at 365 parts, a third of a one-partition query's time in DuckDB).
PARTS_INLINE_BYTES = 16 << 10


def table_key(tap_id: str, stream: str) -> str:
    return f"published/{encode_segment(tap_id)}/{encode_segment(stream)}"


def table_uri(storage: Storage, key: str) -> str:
    if isinstance(storage, LocalStorage):
        return str(storage.root / key)
    return f"{storage.url}/{key}"


def storage_options(storage: Storage) -> dict[str, str]:
    """delta-rs's options for the lake's storage: S3 credentials resolved by boto3 (environment,
    profile or the keys given), so delta-rs reaches the same bucket the same way. Never logged."""
    if not isinstance(storage, S3Storage):
        return {}
    import boto3

    opts = storage.open_options()
    session = boto3.session.Session(
        profile_name=opts.get("profile"),
        region_name=opts.get("region"),
        aws_access_key_id=opts.get("access_key_id"),
        aws_secret_access_key=opts.get("secret_access_key"),
        aws_session_token=opts.get("session_token"),
    )
    credentials = session.get_credentials()
    options = {"AWS_REGION": session.region_name or "us-east-1"}
    if credentials is not None:
        frozen = credentials.get_frozen_credentials()
        options |= {"AWS_ACCESS_KEY_ID": frozen.access_key, "AWS_SECRET_ACCESS_KEY": frozen.secret_key}
        if frozen.token:
            options["AWS_SESSION_TOKEN"] = frozen.token
    if opts.get("endpoint_url"):
        options["AWS_ENDPOINT_URL"] = opts["endpoint_url"]
        if opts["endpoint_url"].startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    return options


@dataclass
class Published:
    """A stream's table as the latest project run left it: its version and that run's state."""

    version: int | None  # None: no table yet
    state: dict[str, Any] | None
    state_version: int | None = None  # the version of the commit that carries ``state`` (later ones, a vacuum's, change no file)
    checkpoint: int | None = None  # the version of the table's latest checkpoint
    checkpoint_read: bool = True  # False: planned from the heads (SPEC.md §12), ``checkpoint`` unknown until a commit needs it


def open_table(storage: Storage, key: str, version: int | None = None):
    """The table loaded by delta-rs (at ``version``, else its latest), or None when there is none. A
    load replays the log from its last checkpoint: for vacuum and readers, never a project run's plan."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:  # not DeltaTable.is_deltatable: it holds the GIL while it waits on storage
        return DeltaTable(table_uri(storage, key), version=version, storage_options=storage_options(storage))
    except TableNotFoundError:
        return None


def latest(storage: Storage, key: str, head_hint: int | None = None) -> Published:
    """The table's version and the state of the latest commit written by a project run (later commits
    of other writers, such as a vacuum's fence, carry none): the log's newest entries only. With
    ``head_hint`` (the table's heads, SPEC.md §12) the log is read from that version down, unlisted;
    when that entry is gone, as without it."""
    if head_hint is not None:
        found = _state_at_or_below(storage, key, head_hint)
        if found is not None:
            state, version = found
            return Published(head_hint, state, version, checkpoint_read=False)
    head = delta_log.head(storage, key)
    if head.version is None:
        return Published(None, None)
    found = _state_at_or_below(storage, key, head.version)
    state, version = found if found is not None else (None, None)
    return Published(head.version, state, version, head.checkpoint)


def stored_state(state: dict) -> dict:
    """``state`` as a commit records it: its parts, when their JSON text is longer than ``PARTS_INLINE_BYTES``,
    as the base64 text of that text zlib-compressed (SPEC.md §12)."""
    text = json.dumps(state.get("parts", []), separators=(",", ":"))
    if len(text) <= PARTS_INLINE_BYTES:
        return state
    return state | {"parts": base64.b64encode(zlib.compress(text.encode())).decode("ascii")}


def read_state(stored: dict) -> dict:
    """A state as ``stored_state`` recorded it, its parts a list again."""
    parts = stored.get("parts")
    return stored | {"parts": json.loads(zlib.decompress(base64.b64decode(parts)))} if isinstance(parts, str) else stored


def _state_at_or_below(storage: Storage, key: str, version: int) -> tuple[dict | None, int | None] | None:
    """(state, its version) of the newest entry at or below ``version`` that has one ((None, None): none
    has); None when entry ``version`` itself is gone."""
    for earlier in range(version, -1, -1):
        actions = delta_log.read_actions(storage, key, earlier)
        if actions is None:  # the log was cleaned up below here
            return None if earlier == version else (None, None)
        info = next((action["commitInfo"] for action in actions if "commitInfo" in action), {})
        if STATE_KEY in info:
            return read_state(info[STATE_KEY]), earlier
    return None, None


def fence(storage: Storage, key: str, published: Published) -> bool:
    """Commit the version after ``published`` with no actions (SPEC.md §15): a project run that planned
    from it or earlier can no longer commit. False when another commit took that version first."""
    info = {"timestamp": int(time.time() * 1000), "operation": "WRITE", "operationParameters": {"mode": "Append"}}
    try:
        _commit_actions(storage, key, published, [{"commitInfo": info | {"singerlake-vacuum": "fence"}}])
    except CommitRejected:
        return False
    return True


def _commit_actions(storage: Storage, key: str, base: Published, actions: list[dict]) -> int:
    """The version after ``base``, create-only, and the checkpoint when one is due."""
    version = base.version + 1
    delta_log.write(storage, key, version, actions)
    if delta_log.checkpoint_due(version):
        checkpoint = base.checkpoint if base.checkpoint_read else delta_log.due_checkpoint_at_or_below(base.version)
        delta_log.write_checkpoint(storage, key, version, delta_log.Head(base.version, checkpoint), actions)
    return version


def commit(
    storage: Storage,
    key: str,
    base: Published,
    schema,
    adds: list[dict],
    removes: list[dict],
    overwrite: bool,
    state: dict,
    partition_by: list[str] | None = None,
) -> int:
    """One transaction: add ``adds`` and remove ``removes`` (``{"path", "size", "rows"}``, paths
    relative to the table, and ``partition``, its partition values, on a table partitioned by the columns
    ``partition_by``; with ``overwrite``, every current file and a new schema) and record ``state``.
    Never retried: when another run committed since ``base`` was read, CommitRejected and the table is
    unchanged. A plain commit is one create-only log entry; creating the table and changing its schema
    (rare) go through delta-rs, which writes the protocol and metadata actions."""
    from deltalake import Schema
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import AddAction, CommitProperties, create_table_with_add_actions

    now = int(time.time() * 1000)
    stats = lambda add: json.dumps({"numRecords": add["rows"]})  # noqa: E731
    if base.version is not None and not overwrite:
        info = {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Append"}, "clientVersion": CLIENT}
        info[STATE_KEY] = stored_state(state)
        removed = [{"remove": {"path": r["path"], "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True,
                               "partitionValues": r.get("partition", {}), "size": r["size"]}} for r in removes]  # fmt: skip
        added = [{"add": {"path": a["path"], "partitionValues": a.get("partition", {}), "size": a["size"], "modificationTime": now,
                          "dataChange": True, "stats": stats(a)}} for a in adds]  # fmt: skip
        return _commit_actions(storage, key, base, [{"commitInfo": info}, *removed, *added])
    actions = [AddAction(a["path"], a["size"], a.get("partition", {}), now, True, stats(a)) for a in adds]
    properties = CommitProperties(custom_metadata={STATE_KEY: stored_state(state)}, max_commit_retries=0)
    if base.version is None:
        create_table_with_add_actions(
            table_uri(storage, key), Schema.from_arrow(schema), actions, mode="error", partition_by=partition_by or None,
            configuration=TABLE_CONFIGURATION,
            storage_options=storage_options(storage), commit_properties=properties,
        )  # fmt: skip
        storage.sync([delta_log.log_key(key, 0)])  # delta-rs does not fsync: durable before anything names this version (SPEC.md §9)
        return 0
    try:
        table = open_table(storage, key, base.version)
        if list(table.metadata().partition_columns) != list(partition_by or []):  # delta-rs keeps a table's partition columns
            return _repartition(storage, key, base, table, schema, adds, state, partition_by or [])
        table.create_write_transaction(actions, mode="overwrite", schema=schema, commit_properties=properties)
    except CommitFailedError:
        raise CommitRejected(f"{storage.url_of(key)}: version {base.version + 1} was committed by another writer first") from None
    storage.sync([delta_log.log_key(key, base.version + 1)])
    return base.version + 1


def _repartition(storage: Storage, key: str, base: Published, table, schema, adds: list[dict], state: dict, partition_by: list[str]) -> int:
    """An overwrite that changes the partition columns (a rebuild, SPEC.md §12), as one create-only log entry:
    the table's metadata with the new schema and partition columns, every current file removed, ``adds`` added."""
    import pyarrow as pa
    from deltalake import Schema

    now, metadata = int(time.time() * 1000), table.metadata()
    info = {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Overwrite"}, "clientVersion": CLIENT}
    info[STATE_KEY] = stored_state(state)
    meta = {
        "id": metadata.id, "name": metadata.name, "description": metadata.description, "format": {"provider": "parquet", "options": {}},
        "schemaString": Schema.from_arrow(schema).to_json(), "partitionColumns": partition_by,
        "configuration": dict(metadata.configuration), "createdTime": metadata.created_time,
    }  # fmt: skip
    current = pa.table(table.get_add_actions(flatten=False)).column("path").to_pylist()
    removed = [{"remove": {"path": path, "deletionTimestamp": now, "dataChange": True}} for path in current]
    added = [{"add": {"path": a["path"], "partitionValues": a.get("partition", {}), "size": a["size"], "modificationTime": now,
                      "dataChange": True, "stats": json.dumps({"numRecords": a["rows"]})}} for a in adds]  # fmt: skip
    return _commit_actions(storage, key, base, [{"commitInfo": info}, {"metaData": meta}, *removed, *added])
