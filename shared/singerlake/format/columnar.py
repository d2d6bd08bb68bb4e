"""Typing records at the engine's speed (SPEC.md §12): Arrow's JSON reader reads the records' JSON text
under the column types ``exact`` chose, in bulk and in C++, instead of value by value in Python.

The reader is strict: a value of another kind, an integer beyond 64 bits, a number needing more
precision or scale than its decimal column, a duplicate key or a lone surrogate each raise. So it reads
exactly or not at all, and whatever it cannot read (JSON-text columns, dates and times nested in
structs and lists, records that are not objects) is left to ``exact``'s value-by-value typing, which
gives the same rows. Dates and times are read as text and converted by Arrow only in one strict form
whose reading Python's agrees with; any other form is parsed as ``exact`` parses it.
"""

from __future__ import annotations

from typing import Any

from singerlake.format.exact import MAX_DIGITS, column_type, declared, is_json, parse_date, parse_timestamp, table_schema

STRICT_TIMESTAMP = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$"
STRICT_DATE = r"^\d{4}-\d{2}-\d{2}$"
TIMES = ("timestamp", "date")
# The strict forms of one width each ("d": a digit 0-9, else that byte): what ``in_one_strict_form`` checks
STRICT_FORMS = {
    "timestamp": [b"dddd-dd-ddTdd:dd:ddZ", *(b"dddd-dd-ddTdd:dd:dd." + b"d" * digits + b"Z" for digits in range(1, 7))],
    "date": [b"dddd-dd-dd"],
}
# The reader's unit of work; a record longer than this is typed by ``exact``. Input of more than one
# block is first cut at object boundaries, a pass of its own over every byte: a data file's records
# (about 10 MiB of record text per 50,000) read as one block take 11% less time than in 4 MiB blocks.
BLOCK_BYTES = 64 << 20


def one_per_line(texts) -> Any:
    """JSON texts (an Arrow string array, one value each, none null) as one buffer, a text per line:
    a text holds no raw newline (JSON escapes it in strings), so one that is not a whole value (say
    ``{"a":"}``) cannot be read together with the next (``{"}``) as one, and ``read_lines`` fails
    rather than misplace a row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    if not len(texts):
        return pa.py_buffer(b"")
    lines = pc.binary_join_element_wise(texts, "", "\n")  # each text, then a newline
    width = np.int64 if pa.types.is_large_string(lines.type) else np.int32
    return lines.buffers()[2][: int(np.frombuffer(lines.buffers()[1], width)[len(lines)])]


def read_lines(data, schema):
    """The JSON objects of ``data`` (one after another, separated or not) as a table of ``schema``'s
    columns, other keys ignored; None when a value does not fit its column exactly, or is no object."""
    import pyarrow as pa
    import pyarrow.json as pj

    # newlines_in_values: objects are told apart by their syntax, whatever their lines.
    # One thread: callers read files side by side already (a Spark task per core, a thread per file);
    # the reader's own threads on top cost 2-5% more CPU (a 10M-record projection, 2 cores).
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=True)
    reading = pj.ReadOptions(block_size=min(BLOCK_BYTES, len(data) + 1), use_threads=False)
    try:
        return pj.read_json(pa.BufferReader(data), read_options=reading, parse_options=options)
    except pa.ArrowInvalid:
        return None


def _has_nested_times(schema: dict) -> bool:
    kind = declared(schema)
    if kind == "struct":
        return any(declared(spec) in TIMES or _has_nested_times(spec) for spec in schema["properties"].values())
    if kind == "list":
        return declared(schema["items"]) in TIMES or _has_nested_times(schema["items"])
    return False


def read_type(schema: dict, need: Any):
    """The type Arrow's reader reads a column as (dates and times as text); None when it cannot."""
    import pyarrow as pa

    if is_json(schema, need) or _has_nested_times(schema):
        return None
    return pa.string() if declared(schema) in TIMES else _roomy(column_type(schema, need))


def _roomy(kind):
    """``kind`` with every decimal of the widest precision: the reader counts a number's trailing zeros
    (1.50 is 3 digits) before it rescales, so the column's own precision is checked by the cast after."""
    import pyarrow as pa

    if pa.types.is_decimal(kind):
        return pa.decimal128(MAX_DIGITS, kind.scale)
    if pa.types.is_struct(kind):
        return pa.struct([field.with_type(_roomy(field.type)) for field in kind])
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_roomy(kind.value_type)))
    return kind


def read_schema(properties: dict, types: dict):
    """The columns Arrow's reader reads records as, to type them as ``exact`` does; None when one cannot be read that way."""
    import pyarrow as pa

    read = {name: read_type(spec, types.get(name)) for name, spec in properties.items()}
    return None if None in read.values() else pa.schema(list(read.items()))


def typed_from(read, properties: dict, types: dict):
    """The published rows from a table ``read`` under ``read_schema`` (other columns ignored): dates
    and times converted; None when one is not what its column's need says."""
    import pyarrow as pa

    schema = table_schema(properties, types)
    columns = []
    for name, spec in properties.items():
        column = read[name]
        if declared(spec) in TIMES:
            column = times(column, declared(spec))
            if column is None:
                return None
        try:
            columns.append(column.cast(schema.field(name).type))  # a decimal beyond its column's precision raises
        except pa.ArrowInvalid:
            return None
    return pa.Table.from_arrays(columns, schema=schema)


def typed_texts(properties: dict, types: dict, texts):
    """``exact.typed_table`` of records given as their JSON texts (an Arrow string array), read by
    Arrow; None when some value cannot be read exactly that way (the caller types them with ``exact``)."""
    schema = read_schema(properties, types)
    if schema is None:
        return None
    if not len(texts):
        return table_schema(properties, types).empty_table()
    read = read_lines(one_per_line(texts), schema)
    return None if read is None or read.num_rows != len(texts) else typed_from(read, properties, types)


def times(strings, kind: str):
    """Date or time texts as Arrow values, equal to ``exact``'s; None when a text is no date or time
    (then the column's need is not this kind)."""
    parsed = parse_times(strings, kind)
    return parsed if parsed.null_count == strings.null_count else None


def in_one_strict_form(strings, kind: str, quote: bytes = b"") -> bool:
    """Whether every text (a string array) is in the same strict form of ``kind`` (in ``quote``s): UTC
    times all with as many fraction digits, or dates. Checked for all texts at once, a byte column at a
    time (a regex costs 0.14 s per 1M texts, this 0.01 s). False also when some text is null."""
    import numpy as np
    import pyarrow as pa

    if strings.type != pa.string() or strings.null_count or not len(strings):
        return False
    offsets = np.frombuffer(strings.buffers()[1], np.int32)[strings.offset : strings.offset + len(strings) + 1]
    width = int(offsets[1] - offsets[0])
    form = next((quote + form + quote for form in STRICT_FORMS[kind] if len(form) + 2 * len(quote) == width), None)
    if form is None or (np.diff(offsets) != width).any():
        return False
    texts = np.frombuffer(strings.buffers()[2], np.uint8)[offsets[0] : offsets[-1]].reshape(-1, width)
    template = np.frombuffer(form, np.uint8)
    digit = template == ord("d")
    digits = texts[:, digit]
    return bool(((digits >= ord("0")) & (digits <= ord("9"))).all() and (texts[:, ~digit] == template[~digit]).all())


def parse_times(strings, kind: str):
    """Date or time texts (``kind``) as Arrow values, as ``exact`` parses them: the strict form by Arrow,
    any other by Python; a text that is no date or time is null."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if kind == "timestamp":
        strict, target, parse = STRICT_TIMESTAMP, pa.timestamp("us", tz="UTC"), parse_timestamp
    else:
        strict, target, parse = STRICT_DATE, pa.date32(), parse_date
    strings = strings.combine_chunks() if isinstance(strings, pa.ChunkedArray) else strings
    uniform = in_one_strict_form(strings, kind)
    regular = None if uniform else pc.fill_null(pc.match_substring_regex(strings, strict), True)  # a null stays null
    try:
        if uniform or pc.all(regular).as_py():
            return pc.cast(strings, target)
        values = pc.cast(pc.if_else(regular, strings, pa.scalar(None, pa.string())), target).to_pylist()
        others = np.flatnonzero(~regular.to_numpy(zero_copy_only=False)).tolist()
    except pa.ArrowInvalid:  # a strict form that is no date (February 30th): each text on its own
        values, others = [None] * len(strings), range(len(strings))
    for index in others:
        values[index] = parse(strings[index].as_py())
    return pa.array(values, target)
