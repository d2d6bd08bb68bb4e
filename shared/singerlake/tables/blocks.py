"""Blocks (SPEC.md §12): the rows one read task found for one bucket, on their way to the task that
writes the bucket's part, with their typed rows: few large values instead of a row per record.

Executors that may be other machines exchange blocks through Spark's shuffle (lz4-compressed Arrow
IPC, so the JVM moves a third of the bytes). Executors of this machine exchange them through files
of the run's block directory instead (uncompressed Arrow IPC): the JVM then moves only where each
block is, not the blocks, and nothing is compressed to be read back on the same disk.
"""

from __future__ import annotations

import collections
import functools
import os
import pickle
import uuid
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

BLOCKS = "_bucket long, rows binary, typed binary"  # a block as it crosses Spark's shuffle
# A block in a block file: its bytes there (``typed`` 0: the rows have no typed rows)
BLOCK_REFS = "_bucket long, file string, offset long, rows long, typed long"
BLOCK_REFS_NAMES = [column.split()[0] for column in BLOCK_REFS.split(", ")]
BLOCKS_PER_BATCH = 16  # blocks (and data files to read) per Arrow batch: each is up to a bucket's rows


def buckets_of(keys: list[bytes], buckets: int):
    """The bucket of each key (its ``_key`` text's UTF-8 bytes), as a numpy array: stable across runs, processes and machines."""
    import numpy as np

    return np.fromiter(map(zlib.crc32, keys), np.int64, len(keys)) % buckets


def bucket_of(key: str, buckets: int) -> int:
    """The bucket of one ``_key`` text."""
    return int(buckets_of([key.encode()], buckets)[0])


def to_block(table):
    """``table`` as one lz4-compressed Arrow IPC stream, in bytes (for Spark's shuffle)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    write_stream(sink, table, "lz4")
    return sink.getvalue().to_pybytes()


def write_stream(sink, table, compression: str | None = None) -> None:
    """``table`` as one Arrow IPC stream at ``sink``'s position (the sink stays open)."""
    import pyarrow as pa

    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_table(table)


def from_block(data):
    import pyarrow as pa

    return pa.ipc.open_stream(data).read_all()


def cut(staging, typed, buckets: int) -> Iterator[tuple[int, Any, Any]]:
    """``(bucket, rows, typed)`` for each bucket among staging rows (and their typed rows, or None), rows in their order."""
    import numpy as np
    import pyarrow as pa

    keys = staging["_key"].cast(pa.binary()).to_pylist()
    of = buckets_of(keys, buckets)
    order = np.argsort(of, kind="stable")
    # one take, then a slice per bucket (a take per bucket would copy the rows per bucket); Arrow takes
    # from one chunk three times as fast as from many
    of, take = of[order], pa.array(order)
    staging, typed = staging.combine_chunks().take(take), None if typed is None else typed.combine_chunks().take(take)
    starts = [0, *(np.flatnonzero(np.diff(of)) + 1).tolist()] if len(of) else []
    for start, end in zip(starts, [*starts[1:], len(of)], strict=True):
        yield int(of[start]), staging.slice(start, end - start), None if typed is None else typed.slice(start, end - start)


def shuffle_blocks(pieces: Iterable[tuple[int, Any, Any]]) -> Iterator[Any]:
    """Each ``(bucket, rows, typed)`` as one row of ``BLOCKS`` for Spark's shuffle."""
    import pyarrow as pa

    for bucket, rows, typed in pieces:
        typed_block = None if typed is None else to_block(typed)
        yield pa.RecordBatch.from_pydict({"_bucket": [bucket], "rows": [to_block(rows)], "typed": [typed_block]})


def shuffled_groups(batches: Iterator[Any]) -> Iterator[tuple[int, Any, Any]]:
    """``(bucket, rows, typed)`` for each bucket among a partition's shuffled blocks, joined. The
    partition's blocks are held as they came (compressed), and one bucket's rows are decoded at a time."""
    held: dict[int, list[tuple]] = {}
    for batch in batches:
        for bucket, rows, typed in zip(*(batch.column(name).to_pylist() for name in ("_bucket", "rows", "typed")), strict=True):
            held.setdefault(bucket, []).append((rows, typed))
    for bucket in sorted(held):
        yield bucket, *joined([(from_block(rows), None if typed is None else from_block(typed)) for rows, typed in held.pop(bucket)])


def write_block_file(directory: str, pieces: Iterable[tuple[int, Any, Any]]) -> Iterator[Any]:
    """Each ``(bucket, rows, typed)`` written to one new file of ``directory``, one row of ``BLOCK_REFS`` each."""
    import pyarrow as pa

    path = os.path.join(directory, f"{uuid.uuid4().hex}.arrow")
    refs = collections.defaultdict(list)
    with pa.OSFile(path, "wb") as out:  # blocks go straight to the file: no copy in memory first
        for bucket, rows, typed in pieces:
            start = out.tell()
            write_stream(out, rows)
            middle = out.tell()
            if typed is not None:
                write_stream(out, typed)
            refs["_bucket"].append(bucket)
            refs["offset"].append(start)
            refs["rows"].append(middle - start)
            refs["typed"].append(out.tell() - middle)
    if refs:
        yield pa.RecordBatch.from_pydict({**refs, "file": [path] * len(refs["_bucket"])}).select(BLOCK_REFS_NAMES)


def file_groups(refs: dict[int, list[dict]]) -> Iterator[tuple[int, Any, Any]]:
    """``(bucket, rows, typed)`` for each bucket of ``refs`` (its ``BLOCK_REFS`` rows), joined; one bucket's blocks read at a time."""
    import pyarrow as pa

    for bucket in sorted(refs):
        blocks = []
        for ref in refs[bucket]:
            with pa.OSFile(ref["file"]) as file:
                file.seek(ref["offset"])
                data = file.read_buffer(ref["rows"] + ref["typed"])  # an Arrow buffer: sliced below without a copy
            blocks.append((from_block(data.slice(0, ref["rows"])), from_block(data.slice(ref["rows"])) if ref["typed"] else None))
        yield bucket, *joined(blocks)


def filed_tasks(directory: str, tasks: list[dict[int, list[dict]]]) -> list[str]:
    """Each task's block refs in a file of its own in the run's block directory, for ``task_refs``: a task's
    closure then carries one path, not every task's refs (Spark unpickles the closure in each task)."""
    paths = []
    for refs in tasks:
        paths.append(os.path.join(directory, f"task-{uuid.uuid4().hex}.pickle"))
        with open(paths[-1], "wb") as out:
            pickle.dump(refs, out)
    return paths


def task_refs(path: str) -> dict[int, list[dict]]:
    """The block refs ``filed_tasks`` filed for one task (a file of this run, written by its driver)."""
    with open(path, "rb") as file:
        return pickle.load(file)


PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (Linux)


@functools.cache
def _fallocate():
    """libc's fallocate(2), or None where there is none."""
    import ctypes

    try:
        call = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return call


def release(refs: dict[int, list[dict]]) -> None:
    """Give back the disk space and page cache of blocks written into parts: each becomes a hole in its
    block file, freed while other tasks run rather than all when the run's directory is removed (3.8 GB
    for 10M records: 1.4 s at the run's end). Called by the task that read them, once its parts are
    written; a block read again after that fails (no schema) instead of reading as no rows."""
    fallocate = _fallocate()
    if fallocate is None:
        return
    by_file: dict[str, list[dict]] = collections.defaultdict(list)
    for ref in (ref for blocks in refs.values() for ref in blocks):
        by_file[ref["file"]].append(ref)
    for path, blocks in by_file.items():
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            continue  # gone: nothing to give back
        try:
            for ref in blocks:
                fallocate(fd, PUNCH_HOLE, ref["offset"], ref["rows"] + ref["typed"])  # failing: freed with the directory
        finally:
            os.close(fd)


def joined(blocks: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """One bucket's ``(rows, typed)`` from its blocks (``typed`` None unless every block has them).
    Blocks go in the order of their first rows: each read task's rows are in position order and its
    files follow another's, so a bucket's rows are too and need no sort (``current_indices``)."""
    import pyarrow as pa

    blocks = sorted(blocks, key=lambda block: (block[0]["_singerlake_commit"][0].as_py(), block[0]["_singerlake_index"][0].as_py()))
    typed = [t for _, t in blocks]
    return pa.concat_tables([rows for rows, _ in blocks]), None if None in typed else pa.concat_tables(typed)


def block_bytes(refs: list[dict]) -> int:
    """The bytes of the blocks ``refs`` names (rows and typed rows)."""
    return sum(ref["rows"] + ref["typed"] for ref in refs)


def by_bucket(refs: list[dict]) -> dict[int, list[dict]]:
    grouped: dict[int, list[dict]] = collections.defaultdict(list)
    for ref in refs:
        grouped[ref["_bucket"]].append(ref)
    return dict(grouped)


def spread(refs: dict[int, list[dict]], tasks: int) -> list[dict[int, list[dict]]]:
    """The buckets of ``refs`` dealt to at most ``tasks`` tasks, the largest first to the least loaded (bytes)."""
    size = {bucket: block_bytes(blocks) for bucket, blocks in refs.items()}
    loads = [(0, task, {}) for task in range(min(tasks, len(refs)))]
    for bucket in sorted(size, key=lambda bucket: (-size[bucket], bucket)):
        load, task, given = min(loads)
        given[bucket] = refs[bucket]
        loads[task] = (load + size[bucket], task, given)
    return [given for _, _, given in loads]
