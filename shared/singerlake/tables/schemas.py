"""A published table's schema, from the column types a stream's records need and the types a user chose
(SPEC.md §12): Arrow only, so what reads a table's description (``ls``, the docs site) needs no Spark."""

from __future__ import annotations

from singerlake.format.exact import table_schema
from singerlake.tables.deletes import table_properties
from singerlake.tables.overrides import chosen_schema
from singerlake.tables.partitions import schema_with_columns


def published_schema(properties: dict, types: dict, overrides: dict | None = None, partitioning: list[dict] | None = None):
    """The published table's Arrow schema: exact types (``exact``), the chosen ones where the user chose,
    then a partitioned table's derived partition columns."""
    return schema_with_columns(chosen_schema(table_schema(table_properties(properties, types), types), overrides), partitioning)


def schema_text(properties: dict, types: dict, overrides: dict | None = None) -> str:
    """The published schema as text: equal text, equal column types (field metadata included)."""
    return published_schema(properties, types, overrides).to_string(show_field_metadata=True, show_schema_metadata=False)
