"""The published tables as Iceberg tables too (SPEC.md §12), through pyiceberg, in the catalog the user names.

The Delta table stays the projection's commit point (its log carries each run's state). Iceberg
gets the same Parquet files: after a stream's Delta commit, one Iceberg snapshot makes the Iceberg
table's data files equal to the Delta table's (files added with name mapping: published files hold
no field ids), recording the Delta version it mirrors. A run whose Iceberg commit failed leaves that
version behind; the next run catches up, even when the Delta table has nothing new.

    published/<tap>/<stream>/part-*.parquet         the data files of both tables
    published/<tap>/<stream>/_iceberg/metadata/     Iceberg's metadata (the table's location)
    published/<tap>/<stream>/_iceberg/singerlake.lock   one commit at a time per table (SPEC.md §8)

Catalogs are configured the way pyiceberg users configure them (``.pyiceberg.yaml``,
``PYICEBERG_CATALOG__<NAME>__URI`` ...): SQL (SQLite, PostgreSQL), REST, Glue ... Namespace = the
tap id, table = the stream name with every character other than letters, digits and ``_`` as ``_``.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from singerlake.commits.errors import CommitRejected
from singerlake.commits.lock import Lock
from singerlake.errors import ConfigError
from singerlake.format.layout import LOCK
from singerlake.storage import LocalStorage, Storage
from singerlake.tables import delta

log = logging.getLogger("singerlake.project")

DELTA_VERSION = "singerlake.delta-version"
COMMIT_ATTEMPTS = 5  # a catalog's compare-and-swap lost to writers outside the lake's lock
POSITION = "singerlake.position"
NAME_MAPPING = "schema.name-mapping.default"
# A commit per run: metadata files older than the last 100 are deleted as each commit is made (their
# snapshots are still listed by the newer ones until vacuum expires them).
BOUNDED_METADATA = {"write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "100"}
STREAM = "singerlake.stream"  # table property: the stream it holds (two names may map to one table name)


def identifier(tap_id: str, stream: str) -> tuple[str, str]:
    """The table's (namespace, name): the tap id, and the stream name with odd characters as ``_``
    (``public.users`` -> ``public_users``: a dot would be read as a namespace level)."""
    return tap_id, re.sub(r"[^A-Za-z0-9_]", "_", stream)


def file_uri(storage: Storage, key: str) -> str:
    uri = delta.table_uri(storage, key)
    return f"file://{uri}" if isinstance(storage, LocalStorage) else uri


def fileio_properties(storage: Storage) -> dict[str, str]:
    """pyiceberg's FileIO properties for the lake's storage: a local lake's durable writes, or S3 with the credentials delta-rs gets."""
    if isinstance(storage, LocalStorage):
        from singerlake.tables import iceberg_io

        return iceberg_io.properties(storage)
    options = delta.storage_options(storage)
    names = {
        "AWS_ACCESS_KEY_ID": "s3.access-key-id",
        "AWS_SECRET_ACCESS_KEY": "s3.secret-access-key",
        "AWS_SESSION_TOKEN": "s3.session-token",
        "AWS_REGION": "s3.region",
        "AWS_ENDPOINT_URL": "s3.endpoint",
    }
    return {names[key]: value for key, value in options.items() if key in names}


def open_catalog(name: str, storage: Storage):
    """The catalog ``name`` as pyiceberg's configuration (file or environment) describes it, its
    S3 access defaulting to the lake's. An unknown name or a catalog that fails to open: ConfigError."""
    try:
        from pyiceberg.catalog import load_catalog
        from pyiceberg.utils.config import Config
    except ImportError:
        raise ConfigError("--formats iceberg needs pyiceberg: pip install 'singerlake[spark]'") from None
    config = Config().get_catalog_config(name.lower())
    if not config:
        raise ConfigError(f"iceberg catalog {name!r} is not configured: set PYICEBERG_CATALOG__{name.upper()}__URI (or .pyiceberg.yaml)")
    try:
        return load_catalog(name, **(fileio_properties(storage) | dict(config)))
    except Exception as exc:
        raise ConfigError(f"iceberg catalog {name!r} could not be opened: {exc}".splitlines()[0]) from None


def ensure_namespace(catalog, namespace: str) -> None:
    """The namespace, created unless it exists. Another thread or run may create it meanwhile: some
    catalogs then raise other errors than NamespaceAlreadyExistsError (SQLite: a unique constraint)."""
    if catalog.namespace_exists(namespace):
        return
    try:
        catalog.create_namespace(namespace)
    except Exception:
        if not catalog.namespace_exists(namespace):
            raise


def _load_or_create(catalog, tap_id: str, stream: str, location: str, schema):
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError

    namespace, name = identifier(tap_id, stream)
    try:
        table = catalog.load_table((namespace, name))
    except NoSuchTableError:
        ensure_namespace(catalog, namespace)
        try:
            table = catalog.create_table((namespace, name), schema=schema, location=location, properties={STREAM: stream})
        except TableAlreadyExistsError:
            table = catalog.load_table((namespace, name))
    held = table.properties.get(STREAM)
    if held != stream:
        holds = f"stream {held!r}" if held else "no singerlake stream"
        raise ConfigError(f"iceberg table {namespace}.{name} holds {holds}, not {stream!r}")
    if _place(table.location()) != _place(location):  # the same tap and stream in another lake
        raise ConfigError(f"iceberg table {namespace}.{name} is another lake's (its location is {table.location()}, not {location})")
    return table


def _place(location: str) -> str:
    """A location as compared: a local path with or without ``file://``, without a trailing ``/``."""
    return location.removeprefix("file://").rstrip("/")


def lock_key(table_key: str) -> str:
    return f"{table_key}/_iceberg/{LOCK}"


def retained_files(storage: Storage, catalog, tap_id: str, stream: str, cutoff_ms: int, apply: bool) -> set[str]:
    """The data files (URIs) of every Iceberg snapshot vacuum keeps (SPEC.md §15); the caller holds the
    table's Iceberg lock. With the catalog, snapshots older than ``cutoff_ms`` (never the current one,
    nor a branch's or tag's) are expired first (with ``apply``; metadata only). Without it, or when the
    catalog has no such table of ours: every snapshot of every metadata file the table's folder holds."""
    table = _our_table(catalog, tap_id, stream) if catalog is not None else None
    if table is None:
        return _files_of_every_metadata_file(storage, delta.table_key(tap_id, stream))
    protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
    expiring = {s.snapshot_id for s in table.metadata.snapshots if s.timestamp_ms < cutoff_ms and s.snapshot_id not in protected}
    if apply and expiring:
        table.maintenance.expire_snapshots().by_ids(sorted(expiring)).commit()
        table = table.refresh()
    return snapshot_files(table, [s for s in table.metadata.snapshots if s.snapshot_id not in expiring])


def _our_table(catalog, tap_id: str, stream: str):
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = catalog.load_table(identifier(tap_id, stream))
    except NoSuchTableError:
        return None
    return table if table.properties.get(STREAM) == stream else None


def _files_of_every_metadata_file(storage: Storage, key: str) -> set[str]:
    from pyiceberg.table import StaticTable

    found: set[str] = set()
    for info in storage.list(f"{key}/_iceberg/metadata/"):
        if info.key.endswith(".metadata.json"):
            table = StaticTable.from_metadata(file_uri(storage, info.key), fileio_properties(storage))
            found |= snapshot_files(table, table.metadata.snapshots)
    return found


def snapshot_files(table, snapshots) -> set[str]:
    """The data files (URIs) any of ``snapshots`` lists: the live entries of their manifests, each manifest read once."""
    manifests = {m.manifest_path: m for snapshot in snapshots for m in snapshot.manifests(table.io)}
    return {
        entry.data_file.file_path
        for manifest in manifests.values()
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    }


def _current_files(table) -> dict[str, Any]:
    snapshot = table.current_snapshot()
    if snapshot is None:
        return {}
    entries = (
        entry for manifest in snapshot.manifests(table.io) for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    )
    return {entry.data_file.file_path: entry.data_file for entry in entries}


def mirrored_version(table) -> int | None:
    snapshot = table.current_snapshot()
    version = snapshot.summary.additional_properties.get(DELTA_VERSION) if snapshot and snapshot.summary else None
    return int(version) if version is not None else None


def same_type(a, b) -> bool:
    """Equal Iceberg types, field ids aside."""
    from pyiceberg.types import ListType, MapType, StructType

    if isinstance(a, StructType) and isinstance(b, StructType):
        return [f.name for f in a.fields] == [f.name for f in b.fields] and all(
            same_type(x.field_type, y.field_type) for x, y in zip(a.fields, b.fields, strict=True)
        )
    if isinstance(a, ListType) and isinstance(b, ListType):
        return same_type(a.element_type, b.element_type)
    if isinstance(a, MapType) and isinstance(b, MapType):
        return same_type(a.key_type, b.key_type) and same_type(a.value_type, b.value_type)
    return a == b


def evolve_schema(tx, arrow_schema) -> None:
    """The table's schema made the Delta table's: columns gone from it are dropped, a column whose
    type changed is dropped and added again (a new field id: older snapshots keep reading their
    files with the old type), new columns are added."""
    from pyiceberg.catalog import Catalog

    wanted = {field.name: field.field_type for field in Catalog._convert_schema_if_needed(arrow_schema).fields}
    current = {field.name: field.field_type for field in tx.table_metadata.schema().fields}
    dropped = [name for name, kind in current.items() if name not in wanted or not same_type(kind, wanted[name])]
    if dropped:
        with tx.update_schema(allow_incompatible_changes=True) as update:
            for name in dropped:
                update.delete_column((name,))
    with tx.update_schema() as update:
        update.union_by_name(arrow_schema)


def live_manifests_only(producer):
    """A snapshot producer that leaves out the parent's manifests holding no live file (only files an
    earlier snapshot deleted), as Java's Iceberg does; pyiceberg carries them into every later
    snapshot, so a table committed once per run would list one more manifest per run, for ever."""
    existing = producer._existing_manifests
    producer._existing_manifests = lambda: [m for m in existing() if m.has_added_files() or m.has_existing_files()]
    return producer


def named(tap_id: str, stream: str, table) -> dict:
    """What project reports of a stream's Iceberg table: its name in the catalog and where readers
    without the catalog find it (DuckDB's ``iceberg_scan``)."""
    namespace, name = identifier(tap_id, stream)
    snapshot = table.current_snapshot()
    return {
        "namespace": namespace,
        "table": name,
        "metadata_location": table.metadata_location,
        "snapshot": snapshot.snapshot_id if snapshot else None,
    }


def evolve_spec(tx, columns: list[str]) -> None:
    """The table's partition spec made identity on ``columns`` (the Delta table's partition columns), as a new spec when it differs."""
    spec = tx.table_metadata.spec()
    schema = tx.table_metadata.schema()
    if [schema.find_column_name(field.source_id) for field in spec.fields] == columns:
        return
    with tx.update_spec() as update:
        for field in spec.fields:
            update.remove_field(field.name)
        for column in columns:
            update.add_identity(column)


def partition_record(table_metadata, partition: dict):
    """A data file's partition (identity on each partition column) from the values its part records, typed as Iceberg holds them."""
    from pyiceberg.typedef import Record
    from pyiceberg.types import BooleanType, DateType, DecimalType, IntegerType, LongType, TimestamptzType

    schema, values = table_metadata.schema(), []
    for field in table_metadata.spec().fields:
        kind, text = schema.find_field(field.source_id).field_type, partition.get(schema.find_column_name(field.source_id))
        if text is None or not isinstance(kind, (BooleanType, DateType, DecimalType, IntegerType, LongType, TimestamptzType)):
            values.append(text)
        elif isinstance(kind, BooleanType):
            values.append(text == "true")
        elif isinstance(kind, DateType):
            values.append((date.fromisoformat(text) - date(1970, 1, 1)).days)
        elif isinstance(kind, DecimalType):
            values.append(Decimal(text))
        elif isinstance(kind, TimestamptzType):
            moment = datetime.fromisoformat(text).replace(tzinfo=UTC)  # as the Delta log writes it, in UTC
            values.append((moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1))
        else:
            values.append(int(text))
    return Record(*values)


def data_file(io, table_metadata, path: str, partition: dict):
    """pyiceberg's ``parquet_file_to_data_file`` with the partition given (ours), not inferred from the footer's statistics."""
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import (
        _check_pyarrow_schema_compatible,
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    input_file = io.new_input(path)
    with input_file.open() as stream:
        metadata = pq.read_metadata(stream)
    schema = table_metadata.schema()
    _check_pyarrow_schema_compatible(schema, metadata.schema.to_arrow_schema(), format_version=table_metadata.format_version)
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata,
        stats_columns=compute_statistics_plan(schema, table_metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return DataFile.from_args(
        content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET, partition=partition_record(table_metadata, partition),
        file_size_in_bytes=len(input_file), sort_order_id=None, spec_id=table_metadata.default_spec_id, equality_ids=None,
        key_metadata=None, **statistics.to_serialized_dict(),
    )  # fmt: skip


def sync(storage: Storage, catalog, tap_id: str, stream: str, published: delta.Published, arrow_schema) -> dict | None:
    """Make the Iceberg table's files the Delta table's at ``published`` in ONE snapshot (none when
    it mirrors that version or a later one already). Returns the table as ``named`` gives it (None: no Delta state yet).
    The catalog's compare-and-swap may be lost to a writer outside the lake's lock (another tool): pyiceberg
    re-applies a commit that does not conflict; one that does (its files changed meanwhile) is planned
    again here on the table as that writer left it, up to ``COMMIT_ATTEMPTS`` times."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    if published.state_version is None or not published.state:
        return None
    key = delta.table_key(tap_id, stream)
    with Lock(storage, lock_key(key), writer_prefix="iceberg"):
        table = _load_or_create(catalog, tap_id, stream, f"{file_uri(storage, key)}/_iceberg", arrow_schema)
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                return named(tap_id, stream, _mirror(storage, key, table, published, arrow_schema))
            except (CommitFailedException, ValidationException) as exc:
                if attempt == COMMIT_ATTEMPTS:
                    raise CommitRejected(f"iceberg table {'.'.join(identifier(tap_id, stream))}: {exc}".splitlines()[0]) from None
                log.info("iceberg table %s changed under this commit (%s); made again", ".".join(identifier(tap_id, stream)), exc)
                table = catalog.load_table(identifier(tap_id, stream))


def _mirror(storage: Storage, key: str, table, published: delta.Published, arrow_schema):
    """One attempt: the snapshot that makes ``table``'s files the Delta table's (``table`` itself when it
    mirrors that version already)."""
    mirrored = mirrored_version(table)
    if mirrored is not None and mirrored >= published.state_version:
        return table
    partitions = {file_uri(storage, f"{key}/{part['published']}"): part.get("partition", {}) for part in published.state["parts"]}
    wanted = set(partitions)
    current = _current_files(table)
    tx = table.transaction()
    evolve_schema(tx, arrow_schema)
    evolve_spec(tx, [entry["column"] for entry in published.state.get("partitioning", [])])
    mapping = tx.table_metadata.schema().name_mapping.model_dump_json()
    wanted_properties = {NAME_MAPPING: mapping} | BOUNDED_METADATA
    if any(tx.table_metadata.properties.get(name) != value for name, value in wanted_properties.items()):
        tx.set_properties(**wanted_properties)
    properties = {DELTA_VERSION: str(published.state_version), POSITION: str(published.state["position"])}
    removed = [file for path, file in current.items() if path not in wanted]
    added = sorted(wanted - set(current))
    snapshot = tx.update_snapshot(snapshot_properties=properties)
    with live_manifests_only(snapshot.overwrite() if removed else snapshot.fast_append()) as producer:
        for file in removed:
            producer.delete_data_file(file)
        for path in added:
            producer.append_data_file(data_file(table.io, tx.table_metadata, path, partitions[path]))
    return tx.commit_transaction()
