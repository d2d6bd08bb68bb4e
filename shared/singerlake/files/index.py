"""The files index (SPEC.md §14): per what, segments of records committed create-only, found through
empty pointers by day and by work id, so a query reads what it asks for, never a listing of all files."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

from singerlake.files import layout
from singerlake.files.errors import Aborted
from singerlake.files.record import last_time, newness, overlaps
from singerlake.format.errors import InvalidMetadata
from singerlake.format.metadata import check_spec_version
from singerlake.pause import pause_point
from singerlake.storage import NotFound, PreconditionFailed, Storage
from singerlake.times import days_between, parse_time_ms


def pointer_dirs(what: str, records: Iterable[dict]) -> set[str]:
    """The directories a segment of ``records`` needs a pointer in."""
    dirs: set[str] = set()
    for record in records:
        days = days_between(record["start"], last_time(record))
        if len(days) > layout.LONG_SPAN_DAYS:
            dirs.add(layout.long_dir(what))
        else:
            dirs.update(layout.day_dir(what, day) for day in days)
        if record["work_id"] is not None:
            dirs.add(layout.work_dir(what, record["work_id"]))
    return dirs


def stored_keys(records: Iterable[dict]) -> Iterator[str]:
    """The keys a push stored for ``records``: each file's bytes and its record."""
    for record in records:
        yield layout.data_key(record["what"], record["where"], record["id"])
        yield layout.record_key(record["id"])


def commit(storage: Storage, what: str, txn: str, records: list[dict]) -> None:
    """Pointers first, the segment last: the segment's create-only write makes every record visible at once.

    The records' files and bytes, and the pointers, may have been written without a sync each
    (``durable=False``), here or on executors: one ``storage.sync`` makes them all durable before the commit point.
    Raises Aborted when a vacuum wrote this txn's segment first."""
    dirs = sorted(pointer_dirs(what, records))
    pause_point("push-before-pointers")
    with ThreadPoolExecutor(storage.parallel_requests) as pool:
        list(pool.map(lambda directory: storage.write(directory + txn, b"", if_none_match=True, durable=False), dirs))
    storage.sync([*stored_keys(records), *(directory + txn for directory in dirs)])
    pause_point("push-before-commit")
    try:
        _write_segment(storage, what, txn, {"records": records})
    except PreconditionFailed:
        raise Aborted(f"push {txn} into {what!r} was aborted by a vacuum before its commit") from None


def abort(storage: Storage, what: str, txn: str) -> bool:
    """Write the segment of a push that died as ``aborted`` (SPEC.md §15): the push can no longer commit.
    False when its segment exists already (it committed, or was aborted before)."""
    try:
        _write_segment(storage, what, txn, {"aborted": True, "records": []})
    except PreconditionFailed:
        return False
    return True


def _write_segment(storage: Storage, what: str, txn: str, content: dict) -> None:
    doc = {"format": layout.SEGMENT_FORMAT, "spec_version": layout.FILES_SPEC_VERSION, "what": what, "txn": txn, **content}
    body = gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=6, mtime=0)
    storage.write(layout.segment_key(what, txn), body, if_none_match=True)


def read_segment(storage: Storage, what: str, txn: str) -> list[dict] | None:
    """The records of a committed push; None for a push that never committed or was aborted (its pointers are leftovers)."""
    key = layout.segment_key(what, txn)
    try:
        data = storage.read(key).data
    except NotFound:
        return None
    source = storage.url_of(key)
    try:
        doc = json.loads(gzip.decompress(data))
    except (OSError, ValueError) as exc:
        raise InvalidMetadata(f"{source}: not a gzip of JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != layout.SEGMENT_FORMAT:
        raise InvalidMetadata(f"{source}: field 'format' must be {layout.SEGMENT_FORMAT!r}")
    check_spec_version(doc, source, layout.FILES_SPEC_VERSION)
    return None if doc.get("aborted") else doc["records"]


_COMMITTED: dict[tuple[str, str, str], None] = {}  # (lake, what, txn) seen committed: a segment never changes once written


def is_committed(storage: Storage, what: str, txn: str) -> bool:
    """Whether push ``txn`` committed (its segment exists and is not aborted); read once per process."""
    key = (storage.url, what, txn)
    if key in _COMMITTED:
        return True
    if read_segment(storage, what, txn) is None:
        return False
    if len(_COMMITTED) >= 100_000:
        _COMMITTED.clear()
    _COMMITTED[key] = None
    return True


def _txns(storage: Storage, directory: str) -> list[str]:
    return [info.key.rsplit("/", 1)[1] for info in storage.list(directory)]


def read_segments(storage: Storage, what: str, txns: Iterable[str]) -> dict[str, list[dict]]:
    """The records of each committed push among ``txns`` (read at once), in txn order; uncommitted ones are left out."""
    ordered = sorted(set(txns))
    with ThreadPoolExecutor(storage.parallel_requests) as pool:
        found = list(pool.map(lambda txn: read_segment(storage, what, txn), ordered))
    return {txn: records for txn, records in zip(ordered, found, strict=True) if records is not None}


def first_per_id(segments: dict[str, list[dict]]) -> dict[str, dict]:
    """One record per id: the earliest push's (txns are UUIDv7, ordered by time)."""
    records: dict[str, dict] = {}
    for txn in sorted(segments):
        for record in segments[txn]:
            records.setdefault(record["id"], record)
    return records


def _records_of(storage: Storage, what: str, txns: Iterable[str]) -> Iterator[dict]:
    """The records of the committed pushes among ``txns``, one per id (the earliest push's)."""
    yield from first_per_id(read_segments(storage, what, txns)).values()


def _listings(storage: Storage, directories: list[str]) -> list[str]:
    with ThreadPoolExecutor(min(storage.parallel_requests, max(1, len(directories)))) as pool:
        return [txn for txns in pool.map(lambda d: _txns(storage, d), directories) for txn in txns]


def by_time(storage: Storage, what: str, start: int, end: int, where: str = "") -> list[dict]:
    """Files of ``what`` whose span overlaps ``[start, end]`` (ms), of the wheres starting with ``where``.
    A range of more than LONG_SPAN_DAYS lists the days that have pointers first (one request per
    1,000 days) instead of asking each day of the range."""
    days = days_between(start, end)
    if len(days) > layout.LONG_SPAN_DAYS:
        present = storage.list_dirs(f"{layout.index_dir(what)}/day/")
        days = [day for day in present if days[0] <= day <= days[-1]]
    directories = [layout.day_dir(what, day) for day in days] + [layout.long_dir(what)]
    found = _records_of(storage, what, _listings(storage, directories))
    return _sorted(r for r in found if r["where"].startswith(where) and overlaps(r, start, end))


def by_work_id(storage: Storage, what: str, work_id: str, where: str = "") -> list[dict]:
    found = _records_of(storage, what, _txns(storage, layout.work_dir(what, work_id)))
    return _sorted(r for r in found if r["where"].startswith(where) and r["work_id"] == work_id)


def latest(storage: Storage, what: str, where: str = "") -> dict | None:
    """The file whose data is newest: walk the days back from the newest until one holds a file of ``where``."""
    longest = [r for r in _records_of(storage, what, _txns(storage, layout.long_dir(what))) if r["where"].startswith(where)]
    best = max(longest, key=newness, default=None)
    for day in reversed(storage.list_dirs(f"{layout.index_dir(what)}/day/")):
        if best is not None and last_time(best) > _day_end(day):
            break  # nothing in this day or before can be newer (one ending at its last ms may tie, and win by `created`)
        found = [r for r in _records_of(storage, what, _txns(storage, layout.day_dir(what, day))) if r["where"].startswith(where)]
        if found:
            return max([*found, *([best] if best else [])], key=newness)
    return best


def _day_end(day: str) -> int:
    return (parse_time_ms(day + "T00:00:00Z") or 0) + 86_400_000 - 1


def _sorted(records: Iterable[dict]) -> list[dict]:
    return sorted(records, key=lambda r: (r["start"], r["where"], r["id"]))


def whats(storage: Storage) -> list[str]:
    return storage.list_dirs(f"{layout.FILES}/index/")


def wheres(storage: Storage, what: str) -> list[str]:
    """The wheres holding bytes of ``what`` (committed or not: for hints, not queries)."""
    return storage.list_dirs(layout.data_dir(what))


def segment_txns(storage: Storage, what: str, keys: Iterable[str] | None = None) -> list[str]:
    """The txns of every committed push of ``what``: one listing of its segments (pointers are not
    read), or taken from ``keys`` listed already."""
    prefix = f"{layout.index_dir(what)}/segments/"
    keys = keys if keys is not None else (info.key for info in storage.list(prefix))
    names = (key[len(prefix) :] for key in keys if key.startswith(prefix))
    return [name[: -len(layout.SEGMENT_SUFFIX)] for name in names if "/" not in name and name.endswith(layout.SEGMENT_SUFFIX)]


def all_records(storage: Storage, what: str) -> list[dict]:
    """Every committed record of ``what``, one per id, each segment read once (for ``singerlake docs``;
    a query reads only the segments its pointers name)."""
    return list(_records_of(storage, what, segment_txns(storage, what)))


def committed_record(storage: Storage, file_id: str) -> dict | None:
    """The record of a pushed file, only once its push committed (SPEC.md §14); None otherwise."""
    key = layout.record_key(file_id)
    try:
        record = json.loads(storage.read(key).data)
    except NotFound:
        return None
    except ValueError as exc:
        raise InvalidMetadata(f"{storage.url_of(key)}: not JSON: {exc}") from None
    if is_committed(storage, record["what"], record["txn"]):
        return record
    # A push of the same bytes racing one that committed them may have written this record over the
    # committed one and died before its own segment: the file is then in a segment of its first bucket.
    what, days = record["what"], days_between(record["start"], last_time(record))
    first_bucket = layout.long_dir(what) if len(days) > layout.LONG_SPAN_DAYS else layout.day_dir(what, days[0])
    return next((r for r in _records_of(storage, what, _txns(storage, first_bucket)) if r["id"] == file_id), None)
