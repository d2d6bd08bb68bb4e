"""A table's parts: a staging file (current rows: ``_key``, positions, the record's JSON text) and its
published twin (the same rows typed exactly, Parquet, and a CSV twin on request).
"""

from __future__ import annotations

import io
from typing import Any

from singerlake.format.columnar import typed_texts
from singerlake.format.exact import decode, json_text, json_value, records_needs, typed_table
from singerlake.storage import Storage
from singerlake.tables import partitions
from singerlake.tables.deletes import SDC_DELETED_AT, apply_deletes, deletes_changed, table_properties
from singerlake.tables.overrides import apply, converted, staging_position
from singerlake.tables.staging import conform
from singerlake.times import new_file_id

PARQUET = {"compression": "zstd", "use_dictionary": False}  # mostly unique values: a dictionary costs more than it saves (SPEC §12)


# -- parts: a staging file and its published twin ------------------------------------------------------
def read_parquet(storage: Storage, key: str, columns: list[str] | None = None):
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(storage.read(key).data), columns=columns)


def records_of(staging) -> list[dict]:
    """The decoded records of staging rows; a row an ACTIVATE_VERSION deleted (soft) carries its time
    as ``_sdc_deleted_at`` unless the record has one of its own."""
    records = [decode(text) for text in staging["_record"].to_pylist()]
    records = [record if isinstance(record, dict) else {} for record in records]
    if "_singerlake_deleted_at" in staging.column_names:
        for record, deleted_at in zip(records, staging["_singerlake_deleted_at"].to_pylist(), strict=True):
            if deleted_at is not None and record.get(SDC_DELETED_AT) is None:
                record[SDC_DELETED_AT] = deleted_at
    return records


def part_deletes(storage: Storage, work: dict) -> dict:
    """A previous part under the run's new activations: ``{"part"}`` unchanged, or ``{"replaced", "part"}``
    with its rewritten staging part (unpublished; ``None`` when no row is left)."""
    part = work["part"]
    staging = conform(read_parquet(storage, part["staging"]))
    rows = apply_deletes(staging, work["activations"], work["hard"])
    if not deletes_changed(staging, rows):
        return {"part": part}
    if not rows.num_rows:
        return {"replaced": part, "part": None}
    written = write_staging(storage, work["staging"], rows, work["properties"])
    return {"replaced": part, "part": written | ({"bucket": part["bucket"]} if "bucket" in part else {})}


def typed_rows(properties: dict, types: dict, staging):
    """A part's published rows from its staging rows: read by Arrow where it reads them exactly
    (``columnar``), else record by record (``exact``); the same rows either way."""
    columns = table_properties(properties, types)
    deleted = "_singerlake_deleted_at" in staging.column_names and staging["_singerlake_deleted_at"].null_count < staging.num_rows
    typed = None if deleted else typed_texts(columns, types, staging["_record"])
    return typed if typed is not None else typed_table(columns, types, records_of(staging))


def write_staging(storage: Storage, prefix: str, staging, properties: dict, needs: dict | None = None) -> dict:
    """A new staging part (create-only) and what its values need (``needs``: known already, e.g. from
    the statistics of the files its rows came from; else found by decoding them). zstd: JSON text
    compresses about as the raw zone's gzip does (snappy: twice that), so a part's stored size compares
    with the raw bytes that size a large stream's buckets."""
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(staging, buffer, **PARQUET)
    key = f"{prefix}/part-{new_file_id()}.parquet"
    storage.write(key, buffer.getvalue(), if_none_match=True)
    if needs is None:
        needs = records_needs(properties, records_of(staging))
    part = {"staging": key, "rows": staging.num_rows, "needs": needs, "bytes": len(buffer.getvalue())}
    keys = key_range(staging["_key"])
    return part | ({"keys": keys} if keys is not None else {})


# -- key ranges: which parts may hold a key, without reading them ---------------------------------------
def _ordered(keys):
    """Keys ordered by (UTF-8 length, text): any total order serves; this one is numeric for integer
    keys (``[999]`` < ``[1000]``), so a part of older ids never holds a newer id's range."""
    import pyarrow.compute as pc

    return pc.binary_length(keys)


def key_range(keys) -> list[str] | None:
    """The least and greatest ``_key`` of a part by (length, text) (SPEC.md §12); None without keys."""
    import pyarrow.compute as pc

    keys = keys.drop_null()
    if not len(keys):
        return None
    lengths = _ordered(keys)
    low, high = pc.min_max(lengths).values()
    return [pc.min(keys.filter(pc.equal(lengths, low))).as_py(), pc.max(keys.filter(pc.equal(lengths, high))).as_py()]


def may_hold(part: dict, keys) -> bool:
    """Whether the part's key range (a part without one: any key) takes in any of ``keys``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if "keys" not in part:
        return True
    (low, high), lengths = part["keys"], _ordered(keys)
    low_length, high_length = pa.scalar(len(low.encode()), lengths.type), pa.scalar(len(high.encode()), lengths.type)
    after = pc.or_(pc.greater(lengths, low_length), pc.and_(pc.equal(lengths, low_length), pc.greater_equal(keys, low)))
    before = pc.or_(pc.less(lengths, high_length), pc.and_(pc.equal(lengths, high_length), pc.less_equal(keys, high)))
    return bool(pc.any(pc.and_(after, before)).as_py())


def trim_part(storage: Storage, item: dict, part: dict, staging, keep) -> tuple[dict, Any]:
    """A previous part without its rows whose keys new records update (``keep``: the rows that stay),
    and its published rows filtered alike (a published file holds its staging rows in their order):
    nothing is decoded. Its needs stay the part's, so a column's type does not narrow when a row is
    updated (narrowing would change the table's schema under its readers and rewrite every file)."""
    trimmed = write_staging(storage, item["staging"], staging.filter(keep), item["properties"], needs=part["needs"])
    trimmed |= {"partition": part["partition"]} if "partition" in part else {}
    return trimmed, read_parquet(storage, f"{item['table']}/{part['published']}").filter(keep)


def publish(
    storage: Storage,
    table: str,
    part: dict,
    properties: dict,
    types: dict,
    csv: bool,
    staging=None,
    published=None,
    overrides: dict | None = None,
    partitioning: list[dict] | None = None,
) -> dict:
    """Write the part's published Parquet file (and CSV twin) from its staging rows (``staging``, else
    read from its staging file), or its rows typed already (``published``); chosen columns (``overrides``)
    converted to their types; a partitioned table's derived partition columns added."""
    import pyarrow.parquet as pq

    if published is None:
        staging = staging if staging is not None else read_parquet(storage, part["staging"])
        published = typed_rows(properties, types, staging)
    if overrides:
        rows = lambda: staging if staging is not None else read_parquet(storage, part["staging"])  # noqa: E731  (only to name a value)
        published = apply(published, overrides, staging_position(rows))
    if partitioning:
        published = partitions.with_columns(published, partitioning, part.get("partition"))
    buffer = io.BytesIO()
    pq.write_table(published, buffer, **PARQUET)
    name = f"part-{new_file_id()}.parquet"
    storage.write(f"{table}/{name}", buffer.getvalue(), if_none_match=True)
    part = {k: v for k, v in part.items() if k != "csv"} | {"published": name, "size": len(buffer.getvalue())}
    return write_csv_twin(storage, table, part, published) if csv else part


def published_batches(storage: Storage, published: str, staging: str, target, chosen: dict):
    """Executor side: a published file's rows (``published``: its key), its chosen columns converted
    (``overrides.converted``), as Arrow batches of ``target``; its staging file is read only to name a failing value."""
    rows = read_parquet(storage, published)
    if chosen["types"]:
        rows = converted(chosen, rows, staging_position(lambda: read_parquet(storage, staging)))
    yield from rows.cast(target).to_batches()


def write_csv_twin(storage: Storage, table: str, part: dict, published=None) -> dict:
    import pyarrow.csv as pacsv

    published = published if published is not None else read_parquet(storage, f"{table}/{part['published']}")
    buffer = io.BytesIO()
    pacsv.write_csv(csv_ready(published), buffer)
    key = f"{table}/_csv/{part['published'].removesuffix('.parquet')}.csv"
    storage.write(key, buffer.getvalue(), if_none_match=True)
    return {**part, "csv": key}


def csv_ready(table):
    """Nested values (structs, lists) as JSON text: CSV cells hold scalars only."""
    import pyarrow as pa

    for index, column in enumerate(table.schema):
        if pa.types.is_nested(column.type):
            texts = [None if v is None else json_text(json_value(v)) for v in table.column(index).to_pylist()]
            table = table.set_column(index, column.name, pa.array(texts, pa.string()))
    return table
