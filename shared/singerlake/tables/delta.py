"""The published Delta Lake tables (SPEC.md §12), through delta-rs (the ``deltalake`` package).

Executors write the Parquet files through the lake's storage; the driver commits them here as one
transaction per project run. The commit's ``commitInfo`` carries the run's state under
``singerlake`` (position, column types, parts), so the table itself says what it holds: there is
no second file to keep in step with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from singerlake.format.names import encode_segment
from singerlake.storage import LocalStorage, S3Storage, Storage

STATE_KEY = "singerlake"


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
    table: Any = None  # the DeltaTable loaded at ``version``: the commit builds on exactly it
    state_version: int | None = None  # the version of the commit that carries ``state`` (later ones, a vacuum's, change no file)


def open_table(storage: Storage, key: str):
    from deltalake import DeltaTable

    uri, options = table_uri(storage, key), storage_options(storage)
    if not DeltaTable.is_deltatable(uri, storage_options=options):
        return None
    return DeltaTable(uri, storage_options=options)


def latest(storage: Storage, key: str) -> Published:
    """The table's version and the state of the latest commit written by a project run (later commits
    of other writers, such as a vacuum, carry none)."""
    table = open_table(storage, key)
    if table is None:
        return Published(None, None)
    for commit in table.history():
        if STATE_KEY in commit:
            return Published(table.version(), commit[STATE_KEY], table, commit["version"])
    return Published(table.version(), None, table)


def fence(published: Published) -> bool:
    """Commit the version after ``published`` with no actions (SPEC.md §15): a project run that planned
    from it or earlier can no longer commit. False when another commit took that version first."""
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties

    properties = CommitProperties(custom_metadata={"singerlake-vacuum": "fence"}, max_commit_retries=0)
    try:
        published.table.create_write_transaction([], mode="append", schema=published.table.schema(), commit_properties=properties)
    except CommitFailedError:
        return False
    return True


def commit(storage: Storage, key: str, base: Published, schema, adds: list[dict], removes: list[str], overwrite: bool, state: dict) -> int:
    """One transaction: add ``adds`` (``{"path", "size", "rows"}``, paths relative to the table), remove
    ``removes`` (or, with ``overwrite``, every current file) and record ``state``. Never retried: when
    another run committed since ``base`` was read, this fails and the table is unchanged."""
    import json

    from deltalake import Schema
    from deltalake.transaction import AddAction, CommitProperties, RemoveAction, create_table_with_add_actions

    now = int(time.time() * 1000)
    actions = [AddAction(a["path"], a["size"], {}, now, True, json.dumps({"numRecords": a["rows"]})) for a in adds]
    properties = CommitProperties(custom_metadata={STATE_KEY: state}, max_commit_retries=0)
    if base.table is None:
        uri = table_uri(storage, key)
        create_table_with_add_actions(
            uri, Schema.from_arrow(schema), actions, mode="error", storage_options=storage_options(storage), commit_properties=properties
        )
        return 0
    if not overwrite:
        actions += [RemoveAction(path, True, now) for path in removes]
    base.table.create_write_transaction(actions, mode="overwrite" if overwrite else "append", schema=schema, commit_properties=properties)
    return base.version + 1
