"""The projection's exact column types (``exact``, SPEC.md §12) as a Spark schema, and Spark -> Arrow schema.

There is one mapping from JSON schema and values to column types, ``exact``'s: this module only
spells its Arrow types as Spark types (``decimal(p, s)``, ``long``, JSON text as a string column
marked ``singerlake.json`` in its field metadata, ...), so the ``singerlake`` data source and
``singerlake sql --raw`` type a column as the published Delta table does.
"""

from __future__ import annotations

from pyspark.sql import types as T

from singerlake.format.exact import Need, field


def struct_type(schema: dict, needs: dict[str, Need]) -> T.StructType:
    """The properties as fields, typed by ``exact`` from the declared ``schema`` and what the values ``needs``;
    a JSON-text field keeps ``exact``'s field metadata (``JSON_FIELD``)."""
    from pyspark.sql.pandas.types import from_arrow_type

    fields = []
    for name, spec in schema.get("properties", {}).items():
        arrow = field(name, spec, needs.get(name))
        metadata = {key.decode(): value.decode() for key, value in (arrow.metadata or {}).items()}
        fields.append(T.StructField(name, from_arrow_type(arrow.type), metadata=metadata or None))
    return T.StructType(fields)


def arrow_schema(struct: T.StructType, timezone: str = "UTC"):
    """The Arrow schema Spark itself uses for ``struct`` in Arrow batches (timestamps labelled ``timezone``,
    Spark's session time zone)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    return pa.schema([pa.field(field.name, to_arrow_type(field.dataType, timezone=timezone)) for field in struct.fields])
