"""Staging rows (SPEC.md §12): a stream's new records read from its data files, and the current row per key.

A staging row is a record's key (``_key``, its key values as JSON text), its position, version, time
and table version, and the record's JSON text as landed. A data file is read in bulk when its column
statistics are known (``bulk_staging_rows``: its envelopes in one decoder call, its records by Arrow's
JSON reader, typed as published in the same read), else line by line (``file_staging_rows``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import Any

from singerlake.format.columnar import (
    STRICT_TIMESTAMP,
    in_one_strict_form,
    one_per_line,
    parse_times,
    read_lines,
    read_schema,
    typed_from,
)
from singerlake.format.datafile import read_data_file
from singerlake.format.exact import decode, json_text, table_schema
from singerlake.format.messages import RecordTexts, cut_record_lines, decode_envelope, decode_record_parts
from singerlake.replay.plan import planned_lines
from singerlake.storage import Storage
from singerlake.times import parse_time_ms, record_time_ms

# A task's threads for work that releases the GIL (gzip, Arrow's JSON reader, Parquet, zstd): tasks
# already run side by side, so more threads would only hold more memory.
CPU_THREADS = 2
ARROW_BATCH_ROWS = 8192
STAGING_SCHEMA = (
    "_key string, _singerlake_commit long, _singerlake_index long, _singerlake_version string, _singerlake_time long, _record string,"
    " _singerlake_table_version long, _singerlake_deleted_at string"
)
NO_TIME = -(2**63)  # a row without a record time loses to any row with one (the window's nulls last)
INT64 = (-(2**63), 2**63 - 1)
KEY_READ = {"long": "int64", "string": "string", "timestamp": "string", "date": "string", None: "string"}  # key needs Arrow reads as JSON
EMPTY_RECORD = b"{}"  # a RECORD without a record
QUOTED_STRICT_TIMESTAMP = f'^"{STRICT_TIMESTAMP[1:-1]}"$'  # a time_extracted that Arrow casts as Python parses it


def staging_schema():
    import pyarrow as pa

    types = {"string": pa.string(), "long": pa.int64()}
    return pa.schema([(name, types[kind]) for name, kind in (column.split() for column in STAGING_SCHEMA.split(", "))])


def conform(table):
    """Staging rows in the current staging schema: columns of older parts' schema missing are null."""
    import pyarrow as pa

    schema = staging_schema()
    for name in schema.names:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, schema.field(name).type))
    return table.select(schema.names).cast(schema)


def table_version(value: Any) -> int | None:
    """The RECORD envelope's ``version`` as staged: a 64-bit integer, else none."""
    return value if type(value) is int and INT64[0] <= value <= INT64[1] else None


def key_text(record: dict, keys: list[str]) -> str:
    """A row's ``_key``: its key values as JSON text (one integer key, the common case, without the encoder)."""
    if len(keys) == 1 and type(value := record.get(keys[0])) is int:
        return f"[{value}]"
    return json_text([record.get(name) for name in keys])


def file_staging_rows(storage: Storage, keys: list[str], file: dict) -> Iterator[tuple]:
    """Staging rows of one planned data file (``datasource.plan_files``), read line by line after checking its hash."""
    for index, commit, position, line in planned_lines(storage, file):
        envelope = decode_envelope(line, index + 2)
        text = bytes(envelope.record).decode() or "{}"
        record = decode(text)
        record = record if isinstance(record, dict) else {}
        ms = record_time_ms(envelope.time_extracted, functools.partial(record.get, "_sdc_extracted_at"))
        key = key_text(record, keys) if keys else None
        yield (key, commit, position, file["version"], ms, text, table_version(envelope.version), None)


def bulk_staging_rows(storage: Storage, keys: list[str], needs: dict, file: dict, typing: tuple[dict, dict] | None = None):
    """The staging rows of one planned data file read in bulk: its envelopes in one decoder call, its
    records by Arrow's JSON reader, their keys under the types their statistics (``needs``) give and,
    with ``typing`` (published properties, column types), typed as published in the same read (else
    None). None when that cannot read them exactly: ``file_staging_rows`` then reads them line by line."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    key_needs = [needs.get(name, "unknown") for name in keys]
    if not all(need is None or (isinstance(need, str) and need in KEY_READ) for need in key_needs):
        return None
    wanted = {name: pa.type_for_alias(KEY_READ[need]) for name, need in zip(keys, key_needs, strict=True)}
    data = read_data_file(storage, file["entry"])
    parts = record_texts(memoryview(data)[data.find(b"\n") + 1 or len(data) :])  # after the SCHEMA line, not copied
    runs = file["runs"]
    if parts is None or len(parts.records) != sum(count for _, _, count in runs):
        return None
    end = file.get("take", len(parts.records))  # a streaming micro-batch ends inside this file
    texts, time_texts, versions = parts.records[file["skip"] : end], parts.times[file["skip"] : end], parts.versions[file["skip"] : end]
    commits = np.repeat([commit for commit, _, _ in runs], [count for _, _, count in runs])[file["skip"] : end]
    positions = np.concatenate([np.arange(first, first + count) for _, first, count in runs])[file["skip"] : end]
    times = record_times(time_texts)
    if times.null_count:  # a record without time_extracted is filed under its _sdc_extracted_at (SPEC.md §1)
        wanted.setdefault("_sdc_extracted_at", pa.string())
    read, typed = read_records(texts, wanted, typing)
    if read is None:
        return None
    if times.null_count:
        times = pc.coalesce(times, times_ms(read["_sdc_extracted_at"]))
    key = key_texts([read[name] for name in keys]) if keys else pa.nulls(len(texts), pa.string())
    if key is None:
        return None
    columns = {
        "_key": key,
        "_singerlake_commit": pa.array(commits, pa.int64()),
        "_singerlake_index": pa.array(positions, pa.int64()),
        "_singerlake_version": pa.array([file["version"]] * len(texts), pa.string()),
        "_singerlake_time": times,
        "_record": texts,
        "_singerlake_table_version": table_versions(versions),
        "_singerlake_deleted_at": pa.nulls(len(texts), pa.string()),
    }
    return pa.table(columns, schema=staging_schema()), typed


def record_texts(lines: memoryview) -> RecordTexts | None:
    """The parts of a data file's RECORD lines (a record without one: ``{}``): cut by position when
    they all wrap their records alike (``cut_record_lines``), else decoded in one call; None when
    that cannot read them."""
    cut = cut_record_lines(lines)
    if cut is not None:
        return cut
    envelopes = decode_record_parts(lines)
    if envelopes is None:
        return None
    records = string_array([envelope.record or EMPTY_RECORD for envelope in envelopes])
    times = string_array([envelope.time_extracted for envelope in envelopes])
    if records is None or times is None:
        return None
    return RecordTexts(records, times, [envelope.version for envelope in envelopes])


def read_records(texts, wanted: dict, typing: tuple[dict, dict] | None):
    """``(read, typed)``: the ``wanted`` columns of records (their JSON texts, an Arrow string array) and, with ``typing``,
    their published rows, from one read when the wanted columns are read alike there; ``read`` None when
    Arrow cannot read them exactly, ``typed`` None when only the typing failed."""
    import pyarrow as pa

    count, lines = len(texts), one_per_line(texts)
    if not count:
        return pa.table({name: pa.array([], kind) for name, kind in wanted.items()}), typing and table_schema(*typing).empty_table()
    schema = read_schema(*typing) if typing is not None else None
    if schema is not None and all(schema.field(name).type == kind for name, kind in wanted.items() if name in schema.names):
        both = pa.schema([*schema, *(pa.field(name, kind) for name, kind in wanted.items() if name not in schema.names)])
        read = read_lines(lines, both)
        if read is not None and read.num_rows == count:
            return read, typed_from(read, *typing)
    if not wanted:
        return pa.table({"_": pa.nulls(count)}), None
    read = read_lines(lines, pa.schema(list(wanted.items())))
    return (read if read is not None and read.num_rows == count else None), None


def record_times(texts) -> Any:
    """``parse_time_ms`` of each time given as its JSON text (``time_extracted``; an Arrow string array,
    or bytes-like texts), as an Arrow array (null: no time). A JSON string without escapes is read by
    Arrow, any other text decoded first."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not isinstance(texts, pa.Array):
        raws, texts = texts, string_array(texts)
        if texts is None:
            return pa.array([parse_time_ms(decode(bytes(raw))) if raw else None for raw in raws], pa.int64())
    inner = pc.binary_slice(texts.cast(pa.binary()), 1, -1).cast(pa.string())  # bytes: 20x faster than utf8_slice_codeunits
    if in_one_strict_form(texts, "timestamp", b'"') or pc.all(pc.match_substring_regex(texts, QUOTED_STRICT_TIMESTAMP)).as_py():
        try:
            return milliseconds(pc.cast(inner, pa.timestamp("us", tz="UTC")))
        except pa.ArrowInvalid:  # a strict form that is no time (February 30th): as below
            pass
    plain = pc.match_substring_regex(texts, r'^"[^"\\]*"$')
    ms = times_ms(pc.if_else(plain, inner, pa.scalar(None, pa.string())))
    if pc.all(pc.fill_null(plain, False)).as_py():
        return ms
    values, raws = ms.to_pylist(), texts.to_pylist()
    for index, flag in enumerate(plain.to_pylist()):
        if not flag and raws[index] not in ("", "null"):
            values[index] = parse_time_ms(decode(raws[index]))
    return pa.array(values, pa.int64())


def times_ms(strings) -> Any:
    """``parse_time_ms`` of each text of an Arrow string array (null: no time)."""
    return milliseconds(parse_times(strings, "timestamp"))


def milliseconds(timestamps) -> Any:
    """Epoch milliseconds of Arrow timestamps (microseconds); null before the epoch, as ``parse_time_ms`` gives."""
    import pyarrow as pa
    import pyarrow.compute as pc

    micros = pc.cast(timestamps, pa.int64())
    return pc.if_else(pc.less(micros, 0), pa.scalar(None, pa.int64()), pc.divide(micros, 1000))  # ms >= 0 only: floor


def table_versions(raws: list) -> Any:
    """``table_version`` of each RECORD's ``version`` given as its JSON text (most records have none or the same)."""
    import pyarrow as pa

    if not any(raws):
        return pa.nulls(len(raws), pa.int64())
    found: dict[bytes, int | None] = {b"": None}
    values = []
    for raw in raws:
        text = bytes(raw)
        if text not in found:
            found[text] = table_version(decode(text))
        values.append(found[text])
    return pa.array(values, pa.int64())


def string_array(texts: list) -> Any:
    """Byte strings (bytes-like) as one Arrow string array, copied once; None when they are no UTF-8 (or too long for one array)."""
    import numpy as np
    import pyarrow as pa

    offsets = np.zeros(len(texts) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)), out=offsets[1:])
    if offsets[-1] >= 2**31:
        return None
    array = pa.StringArray.from_buffers(len(texts), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(texts)))
    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return array


def key_texts(columns: list) -> Any:
    """Each row's ``_key`` (``key_text``) from its key columns read by Arrow: 64-bit integers, and
    strings with nothing JSON escapes; None when another value needs the encoder."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = []
    for column in columns:
        if pa.types.is_integer(column.type):
            part = pc.cast(column, pa.string())
        elif pc.any(pc.match_substring_regex(column, r'["\\\x00-\x1f]')).as_py():
            return None
        else:
            part = pc.binary_join_element_wise('"', column, '"', "")
        parts.append(pc.fill_null(part, "null"))
    joined = pc.binary_join_element_wise(*parts, ",") if len(parts) > 1 else parts[0]
    return pc.binary_join_element_wise("[", joined, "]", "")


def read_new_records(storage: Storage, keys: list[str], files: list[dict], needs: dict | None = None, typing: tuple | None = None):
    """``(staging, typed)``: the staging rows of the planned files, in bulk when their statistics
    (``needs``) are known, else line by line; and with ``typing`` (``bulk_staging_rows``) their published
    rows when every file was read in bulk and typed (else None)."""
    import pyarrow as pa

    schema = staging_schema()

    def read(file: dict) -> tuple:
        bulk = bulk_staging_rows(storage, keys, needs, file, typing) if needs is not None else None
        if bulk is not None:
            return bulk
        rows, tables = file_staging_rows(storage, keys, file), []
        while chunk := list(islice(rows, ARROW_BATCH_ROWS)):
            columns = zip(*chunk, strict=True)
            tables.append(pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema))
        return pa.concat_tables(tables) if tables else schema.empty_table(), None

    with ThreadPoolExecutor(CPU_THREADS) as pool:
        tables, typed = zip(*pool.map(read, files), strict=True) if files else ((), ())
    staging = pa.concat_tables(tables) if tables else schema.empty_table()
    if typing is None or None in typed:
        return staging, None
    return staging, pa.concat_tables(typed) if typed else table_schema(*typing).empty_table()


def by_position(table):
    return table.sort_by([("_singerlake_commit", "ascending"), ("_singerlake_index", "ascending")])


def current_indices(table, keyed: bool):
    """The indices of the current rows in ``table``, in position order: the latest row per ``_key`` by
    commit, then record time (a row without one loses), then position; without key properties every
    row. None when they are all its rows in their order. Only the small columns are sorted."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = pa.array(np.arange(table.num_rows, dtype=np.int64))  # not range(): Python would make each number
    if keyed and table.num_rows and len(pc.unique(table["_key"])) < table.num_rows:  # else every row is current
        time = pc.fill_null(table["_singerlake_time"], NO_TIME)
        order = pa.table({"c": table["_singerlake_commit"], "t": time, "i": table["_singerlake_index"], "row": rows})
        ordered = order.take(pc.sort_indices(order, [("c", "ascending"), ("t", "ascending"), ("i", "ascending")]))["row"]
        ranked = pa.table({"key": table["_key"].take(ordered), "rank": rows})
        rows = ordered.take(ranked.group_by(["key"], use_threads=False).aggregate([("rank", "max")])["rank_max"])
    if len(rows) == table.num_rows and in_position_order(table):
        return None
    place = pa.table({"c": table["_singerlake_commit"].take(rows), "i": table["_singerlake_index"].take(rows), "row": rows})
    return place.take(pc.sort_indices(place, [("c", "ascending"), ("i", "ascending")]))["row"]


def in_position_order(table) -> bool:
    import numpy as np

    commits, index = table["_singerlake_commit"].to_numpy(), table["_singerlake_index"].to_numpy()
    step = (np.diff(commits) > 0) | ((np.diff(commits) == 0) & (np.diff(index) > 0))
    return bool(step.all())
