"""The files area checked against its index (SPEC.md §14): what verify reports, repair restores and
vacuum deletes. The committed segments are the truth; pointers and record files are derived from
them, and bytes, records and pointers of pushes that never committed are leftovers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from singerlake.files import index, layout
from singerlake.format.metadata import new_digest
from singerlake.storage import NotFound, ObjectInfo, Storage
from singerlake.times import iso_ms


@dataclass(frozen=True)
class Problem:
    kind: str  # missing | size_mismatch | hash_mismatch | orphan | metadata
    path: str
    detail: str


@dataclass
class WhatState:
    """One what's committed records (by id, the earliest push's) and the keys around them."""

    what: str
    segments: dict[str, list[dict]]  # txn -> records
    records: dict[str, dict]
    listing: dict[str, ObjectInfo]  # everything under files/index/<what>/ and files/data/<what>/

    def pointers(self) -> set[str]:
        return {k for k in self.listing if k.startswith(layout.index_dir(self.what)) and "/segments/" not in k}


def read_what(storage: Storage, what: str) -> WhatState:
    listing = {i.key: i for prefix in (f"{layout.index_dir(what)}/", f"{layout.FILES}/data/{what}/") for i in storage.list(prefix)}
    segments = index.read_segments(storage, what, index.segment_txns(storage, what, listing))  # from the listing above
    return WhatState(what, segments, index.first_per_id(segments), listing)


def states(storage: Storage) -> Iterator[WhatState]:
    for what in index.whats(storage):
        yield read_what(storage, what)


def _stored_record(storage: Storage, file_id: str) -> dict | None:
    try:
        return json.loads(storage.read(layout.record_key(file_id)).data)
    except (NotFound, ValueError):
        return None


def verify_files(storage: Storage, check_hashes: bool) -> list[Problem]:
    problems = []
    for state in states(storage):
        problems += _verify_what(storage, state, check_hashes)
    return problems


def _verify_what(storage: Storage, state: WhatState, check_hashes: bool) -> list[Problem]:
    problems = []
    for record in state.records.values():
        info = state.listing.get(record["key"])
        if info is None:
            problems.append(Problem("missing", record["key"], f"file {record['id']} is indexed but its bytes are gone"))
        elif info.size != record["size"]:
            problems.append(Problem("size_mismatch", record["key"], f"{info.size:,} bytes on storage, the record says {record['size']:,}"))
    with ThreadPoolExecutor(storage.parallel_requests) as pool:
        stored = dict(zip(state.records, pool.map(lambda fid: _stored_record(storage, fid), state.records), strict=True))
    for fid, found in stored.items():
        if found is None or not index.segment_exists(storage, state.what, found.get("txn", "")):
            problems.append(
                Problem("metadata", layout.record_key(fid), "record file missing or not naming a committed push (repair rewrites it)")
            )
    for key in sorted(set(_wanted_pointers(state)) - state.pointers()):
        problems.append(Problem("metadata", key, "index pointer missing: queries miss its push's files (repair restores it)"))
    keys = {r["key"] for r in state.records.values()}
    for key, info in state.listing.items():
        if key.startswith(f"{layout.FILES}/data/") and key not in keys:
            problems.append(Problem("orphan", key, f"bytes of a push that never committed, written {iso_ms(int(info.mtime * 1000))}"))
    if check_hashes:
        present = [r for r in state.records.values() if r["key"] in state.listing]
        with ThreadPoolExecutor(storage.parallel_requests) as pool:
            hashes = list(pool.map(lambda r: _hash(storage, r["key"]), present))
        for record, found in zip(present, hashes, strict=True):
            if found != record["hash"]:
                problems.append(Problem("hash_mismatch", record["key"], f"blake2 {found} on storage, the record says {record['hash']}"))
    return problems


def _wanted_pointers(state: WhatState) -> Iterator[str]:
    for txn, records in state.segments.items():
        for directory in index.pointer_dirs(state.what, records):
            yield directory + txn


def _hash(storage: Storage, key: str) -> str | None:
    digest = new_digest()
    try:
        with storage.open_read(key) as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except NotFound:
        return None
    return digest.hexdigest()


def repair_files(storage: Storage, apply: bool) -> list[tuple[str, str]]:
    """Restore what the committed segments say: missing pointers and record files. (path, action)"""
    actions = []
    for state in states(storage):
        for key in sorted(set(_wanted_pointers(state)) - state.pointers()):
            actions.append((key, "write the missing index pointer"))
            if apply:
                storage.write(key, b"", if_none_match=True)
        for fid, record in state.records.items():
            found = _stored_record(storage, fid)
            if found is None or not index.segment_exists(storage, state.what, found.get("txn", "")):
                actions.append((layout.record_key(fid), "rewrite the record file from its committed push"))
                if apply:
                    storage.write(layout.record_key(fid), json.dumps(record, separators=(",", ":")).encode())
    return actions


def vacuum_files(storage: Storage, cutoff_ms: int, apply: bool) -> list[tuple[str, str, int]]:
    """Leftovers of pushes that never committed, older than the cutoff: (path, reason, size). Before
    deleting, they are found again: what a push committed meanwhile is kept."""
    chosen = _leftovers(storage, cutoff_ms)
    if apply and chosen:
        again = {path for path, _, _ in _leftovers(storage, cutoff_ms)}
        chosen = [c for c in chosen if c[0] in again]
        for key, _, _ in chosen:
            storage.delete(key)
    return chosen


def _leftovers(storage: Storage, cutoff_ms: int) -> list[tuple[str, str, int]]:
    chosen: list[tuple[str, str, int]] = []
    for state in states(storage):
        committed_keys = {r["key"] for r in state.records.values()}
        for key, info in state.listing.items():
            written = int(info.mtime * 1000)
            if written > cutoff_ms:
                continue
            if key.startswith(f"{layout.FILES}/data/"):
                if key not in committed_keys:
                    chosen.append((key, f"bytes of a push that never committed, written {iso_ms(written)}", info.size))
            elif "/segments/" not in key and key.rsplit("/", 1)[1] not in state.segments:
                chosen.append((key, f"index pointer of a push that never committed, written {iso_ms(written)}", info.size))
    chosen += _stale_records(storage, cutoff_ms)
    for info in storage.leftovers(f"{layout.FILES}/"):
        if info.mtime * 1000 <= cutoff_ms:
            chosen.append((info.key, f"partial write left by a crash at {iso_ms(int(info.mtime * 1000))}", info.size))
    return chosen


def _stale_records(storage: Storage, cutoff_ms: int) -> list[tuple[str, str, int]]:
    """Record files of ids no push committed (their push died), older than the cutoff."""
    committed = {fid for state in states(storage) for fid in state.records}
    found = []
    for info in storage.list(f"{layout.FILES}/ids/"):
        fid = info.key.rsplit("/", 1)[1].removesuffix(".json")
        if fid not in committed and info.mtime * 1000 <= cutoff_ms:
            found.append((info.key, f"record of a push that never committed, written {iso_ms(int(info.mtime * 1000))}", info.size))
    return found
