"""The rows our Spark jobs hand back to the driver: their schema, and Arrow batches of them.

Both are built the cheap way for a short run's first job. The schema is a ``StructType`` built in
Python: as a DDL string the JVM would parse it, and its first parse costs ~0.2 s. The batches are
built from their buffers: ``pa.array`` of Python values imports pandas, ~0.3 s of every worker's
first task.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

SPARK_TYPES = {"long": "LongType", "string": "StringType"}


def result_schema(**columns: str):
    """``result_schema(seq="long", result="string")``: a flat Spark schema of long and string columns."""
    from pyspark.sql import types as T

    return T.StructType([T.StructField(name, getattr(T, SPARK_TYPES[kind])()) for name, kind in columns.items()])


def result_batch(kinds: dict[str, str], **columns: list) -> Any:
    """An Arrow record batch of equally long columns, each of the kind ``kinds`` names ("long": ints, "string": str)."""
    import pyarrow as pa

    arrays = []
    for name, values in columns.items():
        if kinds[name] == "string":
            texts = [value.encode() for value in values]
            offsets = array("i", [0])
            for text in texts:
                offsets.append(offsets[-1] + len(text))
            buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(texts))]
            arrays.append(pa.Array.from_buffers(pa.string(), len(texts), buffers))
        else:
            arrays.append(pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(array("q", values))]))
    return pa.RecordBatch.from_arrays(arrays, names=list(columns))


class _NoPandas:
    """A finder that makes ``import pandas`` fail, for the moment pyarrow probes for it."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas":
            raise ImportError("pandas is not probed for")


def arrow_without_pandas() -> None:
    """Let pyarrow find no pandas at its first conversion of Python values (``pa.array`` of a list). It would
    import pandas, 0.3-1 s, only to ask whether the values are pandas objects, which ours never are. pyarrow
    tries again, and imports pandas, when something does need it (``to_pandas``, ``from_pandas``)."""
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    probe = _NoPandas()
    sys.meta_path.insert(0, probe)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(probe)
