"""A published table as its readers see it (SPEC.md §12), for ``ls``, ``sql``'s ``\\d`` and the docs site:
its location, version and rows from the latest run's state, and its columns with their types, JSON-text
columns marked with why, chosen types (``--type``) marked as chosen. No data file is read."""

from __future__ import annotations

from typing import Any

from singerlake.format.catalogue import replay_schema
from singerlake.format.exact import json_why
from singerlake.format.manifest import Manifest
from singerlake.storage import NotFound, Storage
from singerlake.tables import delta, iceberg
from singerlake.tables.deletes import deletes_properties, table_properties
from singerlake.tables.schemas import published_schema


def type_name(kind) -> str:
    """An Arrow type as the ``--type`` vocabulary names it (``long``, ``decimal(10,2)``, ``struct<a: long>``)."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return "struct<" + ", ".join(f"{kind.field(i).name}: {type_name(kind.field(i).type)}" for i in range(kind.num_fields)) + ">"
    if pa.types.is_list(kind):
        return f"array<{type_name(kind.value_type)}>"
    if pa.types.is_decimal(kind):
        return f"decimal({kind.precision},{kind.scale})"
    names = {pa.int64(): "long", pa.float64(): "double", pa.string(): "string", pa.bool_(): "boolean", pa.date32(): "date"}
    return names.get(kind) or ("timestamp" if pa.types.is_timestamp(kind) else str(kind))


def table_columns(properties: dict, types: dict, overrides: dict | None = None) -> list[dict]:
    """Each published column: ``{"name", "type", "json_text": why or None, "chosen": type or None}``."""
    overrides = overrides or {}
    shown = table_properties(properties, types)
    schema = published_schema(properties, types, overrides)
    return [
        {
            "name": field.name,
            "type": type_name(field.type),
            "json_text": None if field.name in overrides else json_why(shown[field.name], types.get(field.name)),
            "chosen": overrides.get(field.name),
        }
        for field in schema
    ]


def note(column: dict) -> str:
    """What a reader should know of a column, or ``""``: why it is JSON text, or that its type was chosen."""
    if column["chosen"]:
        return f"type chosen with --type {column['chosen']}"
    return f"JSON text: {column['json_text']}" if column["json_text"] else ""


def type_label(column: dict) -> str:
    """``string (JSON text: why)``, ``double (chosen)``, or the type alone."""
    if column["chosen"]:
        return f"{column['type']} (chosen with --type)"
    return f"{column['type']} (JSON text: {column['json_text']})" if column["json_text"] else column["type"]


def stream_properties(manifest: Manifest, state: dict) -> dict:
    """The properties a run of the table's state types: the replay schema's, with the column soft deletes add."""
    properties = replay_schema(manifest).get("properties", {}) if manifest.versions else {}
    return deletes_properties(properties, state.get("deletes") == "hard", len(manifest.activate_versions) > 0)


def published_table(storage: Storage, manifest: Manifest) -> dict[str, Any] | None:
    """The stream's published tables (None before its first projection): the Delta table's location,
    version, rows and columns, and its Iceberg table when ``_iceberg/metadata/`` holds metadata."""
    key = delta.table_key(manifest.tap_id, manifest.stream)
    published = delta.latest(storage, key)
    if published.state is None:
        return None
    state = published.state
    columns = table_columns(stream_properties(manifest, state), state.get("types", {}), state.get("overrides"))
    table = {
        "location": storage.url_of(key),
        "version": published.version,
        "rows": sum(part["rows"] for part in state.get("parts", [])),
        "columns": columns,
    }
    return table | ({"iceberg": found} if (found := iceberg_table(storage, manifest.tap_id, manifest.stream)) else {})


def iceberg_table(storage: Storage, tap_id: str, stream: str) -> dict | None:
    """The stream's Iceberg table from a listing of its metadata (the catalog is not opened): its name and
    newest metadata file, or None."""
    key = delta.table_key(tap_id, stream)
    try:
        files = [info.key for info in storage.list(f"{key}/_iceberg/metadata/") if info.key.endswith(".metadata.json")]
    except NotFound:
        files = []
    if not files:
        return None
    newest = max(files, key=lambda name: (_sequence(name), name))
    namespace, name = iceberg.identifier(tap_id, stream)
    return {"namespace": namespace, "table": name, "metadata_location": iceberg.file_uri(storage, newest)}


def _sequence(key: str) -> int:
    prefix = key.rsplit("/", 1)[-1].split("-", 1)[0]
    return int(prefix) if prefix.isdigit() else -1
