"""The files area checked against its index (SPEC.md §14): what verify reports, repair restores and
vacuum deletes. The committed segments are the truth; pointers and record files are derived from
them, and bytes, records and pointers of pushes that never committed are leftovers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from singerlake.commits.errors import LockLost, LockTimeout
from singerlake.commits.lock import Lock, looks_stale, read_lock
from singerlake.files import index, layout
from singerlake.format.metadata import new_digest
from singerlake.pause import pause_point
from singerlake.storage import NotFound, ObjectInfo, Storage
from singerlake.text import counted
from singerlake.times import iso_ms, now_ms


@dataclass(frozen=True)
class Problem:
    kind: str  # missing | size_mismatch | hash_mismatch | orphan | metadata
    path: str
    detail: str


@dataclass
class WhatState:
    """One what's committed records (by id, the earliest push's) and the keys around them."""

    what: str
    segments: dict[str, list[dict]]  # txn -> records, committed pushes only
    records: dict[str, dict]
    listing: dict[str, ObjectInfo]  # everything under files/index/<what>/ and files/data/<what>/
    aborting: frozenset[str] = frozenset()  # a dry run's stale txns, taken as aborted

    def pointers(self) -> set[str]:
        kinds = tuple(f"{layout.index_dir(self.what)}/{kind}/" for kind in ("day", "long", "work"))
        return {k for k in self.listing if k.startswith(kinds)}

    def leases(self) -> dict[str, str]:
        """txn -> key of the pushes' leases (SPEC.md §15)."""
        prefix = layout.pending_dir(self.what)
        return {k[len(prefix) :]: k for k in self.listing if k.startswith(prefix)}

    def ended(self) -> set[str]:
        """The txns that have a segment: committed, or aborted by a vacuum."""
        return set(index.segment_txns(None, self.what, self.listing)) | self.aborting


def read_what(storage: Storage, what: str) -> WhatState:
    listing = {i.key: i for prefix in (f"{layout.index_dir(what)}/", f"{layout.FILES}/data/{what}/") for i in storage.list(prefix)}
    segments = index.read_segments(storage, what, index.segment_txns(storage, what, listing))  # from the listing above
    return WhatState(what, segments, index.first_per_id(segments), listing)


def all_whats(storage: Storage) -> list[str]:
    """Every what with an index or stored bytes (a push killed before its lease left bytes only)."""
    return sorted(set(index.whats(storage)) | set(storage.list_dirs(f"{layout.FILES}/data/")))


def states(storage: Storage) -> Iterator[WhatState]:
    for what in all_whats(storage):
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
            problems.append(
                Problem("size_mismatch", record["key"], f"{counted(info.size, 'byte')} on storage, the record says {record['size']:,}")
            )
    with ThreadPoolExecutor(storage.parallel_requests) as pool:
        stored = dict(zip(state.records, pool.map(lambda fid: _stored_record(storage, fid), state.records), strict=True))
    for fid, found in stored.items():
        if found is None or found.get("txn") not in state.segments:
            problems.append(
                Problem("metadata", layout.record_key(fid), "record file missing or not naming a committed push (repair rewrites it)")
            )
    for key in sorted(set(_wanted_pointers(state)) - state.pointers()):
        problems.append(Problem("metadata", key, "index pointer missing: queries miss its push's files (repair restores it)"))
    keys = {r["key"] for r in state.records.values()}
    for key, info in state.listing.items():
        if key.startswith(f"{layout.FILES}/data/") and key not in keys:
            problems.append(Problem("orphan", key, f"bytes of a push that never committed, written {iso_ms(int(info.mtime * 1000))}"))
    ended = state.ended()
    for txn, key in state.leases().items():
        if txn not in ended and looks_stale(read_lock(storage, key), now_ms()):
            problems.append(Problem("stale_lock", key, f"lease of push {txn}, which died before its commit (vacuum aborts it)"))
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
            if found is None or found.get("txn") not in state.segments:
                actions.append((layout.record_key(fid), "rewrite the record file from its committed push"))
                if apply:
                    storage.write(layout.record_key(fid), json.dumps(record, separators=(",", ":")).encode())
    return actions


# -- vacuum (SPEC.md §15) ---------------------------------------------------------------------------
Found = tuple[str, str, int]  # (path, reason, size)


def vacuum_files(storage: Storage, cutoff_ms: int, apply: bool, notes: list[str] | None = None) -> list[Found]:
    """Leftovers of pushes that never committed (or were aborted), older than the cutoff. With ``apply``
    each what is vacuumed holding its ``vacuum.lock`` (another vacuum's: the what is skipped), the txns
    of stale leases are aborted, and a what with a live push is left for a later pass."""
    notes = [] if notes is None else notes
    records = _uncommitted_records(storage, cutoff_ms)
    found = []
    for what in all_whats(storage):
        found += _vacuum_what(storage, what, cutoff_ms, apply, records.pop(what, []), notes)
    unreadable = records.pop(None, [])  # garbage whatever the what: nothing reads a record it cannot parse
    if apply:
        for key, _, _ in unreadable:
            storage.delete(key)
    return found + unreadable


def _vacuum_what(storage: Storage, what: str, cutoff_ms: int, apply: bool, records: list[Found], notes: list[str]) -> list[Found]:
    """One what, under its vacuum lock (SPEC.md §15): the lock is held only while this what is worked on."""
    marker = Lock(storage, layout.vacuum_lock_key(what), writer_prefix="vacuum", wait_s=0)
    if apply:
        try:
            marker.acquire()
        except LockTimeout:
            notes.append(f"files/index/{what}: another vacuum is at work; left for a later pass")
            return []
    try:
        state = _settled_state(storage, what, apply)
        ended = state.ended()
        live = [txn for txn in state.leases() if txn not in ended]
        if live:
            notes.append(f"files/index/{what}: a push is under way (txn {live[0]}); left for a later pass")
            return []
        chosen = _leftovers(storage, state, cutoff_ms)
        chosen += [found for found in records if _record_id(found[0]) not in state.records]  # committed meanwhile: kept
        if apply:
            pause_point("vacuum-before-delete")
            marker.refresh()  # taken over (a push judged this vacuum stalled): LockLost, nothing deleted
            for key, _, _ in chosen:
                storage.delete(key)
        return chosen
    except LockLost:
        notes.append(f"{marker.key}: taken over while this vacuum stalled; nothing of {what} was deleted")
        return []
    finally:
        if apply:
            marker.release()


def _settled_state(storage: Storage, what: str, apply: bool) -> WhatState:
    """The what's state once the txns of stale leases are aborted (with ``apply``; else as if they were)."""
    state = read_what(storage, what)
    now, ended = now_ms(), state.ended()
    stale = [txn for txn, key in state.leases().items() if txn not in ended and looks_stale(read_lock(storage, key), now)]
    if not stale:
        return state
    if not apply:
        return WhatState(what, state.segments, state.records, state.listing, frozenset(stale))
    for txn in stale:
        index.abort(storage, what, txn)  # False: it committed first, which the state read next shows
    return read_what(storage, what)


def _leftovers(storage: Storage, state: WhatState, cutoff_ms: int) -> list[Found]:
    chosen: list[Found] = []
    committed_keys = {r["key"] for r in state.records.values()}
    ended, leases, pointers = state.ended(), set(state.leases().values()), state.pointers()
    for key, info in state.listing.items():
        written = int(info.mtime * 1000)
        if written > cutoff_ms:
            continue
        if key.startswith(f"{layout.FILES}/data/") and key not in committed_keys:
            chosen.append((key, f"bytes of a push that never committed, written {iso_ms(written)}", info.size))
        elif key in pointers and key.rsplit("/", 1)[1] not in state.segments:
            chosen.append((key, f"index pointer of a push that never committed, written {iso_ms(written)}", info.size))
        elif key in leases and key.rsplit("/", 1)[1] in ended:
            chosen.append((key, f"lease of a push that ended, written {iso_ms(written)}", info.size))
    for prefix in (f"{layout.index_dir(state.what)}/", f"{layout.FILES}/data/{state.what}/"):
        for info in storage.stale_leftovers(prefix, cutoff_ms):
            chosen.append((info.key, f"partial write left by a crash at {iso_ms(int(info.mtime * 1000))}", info.size))
    return chosen


def _uncommitted_records(storage: Storage, cutoff_ms: int) -> dict[str | None, list[Found]]:
    """Record files of ids no push committed, older than the cutoff, by the what each names (None:
    unreadable), with partial writes of records; each what's pass checks them again under its lock."""
    found: dict[str | None, list[Found]] = {}
    for info in storage.stale_leftovers(f"{layout.FILES}/ids/", cutoff_ms):
        found.setdefault(None, []).append((info.key, f"partial write left by a crash at {iso_ms(int(info.mtime * 1000))}", info.size))
    listed = [info for info in storage.list(f"{layout.FILES}/ids/") if info.mtime * 1000 <= cutoff_ms]
    committed = {fid for state in states(storage) for fid in state.records} if listed else set()
    for info in listed:
        fid = _record_id(info.key)
        if fid not in committed:
            record = _stored_record(storage, fid)
            what = record.get("what") if isinstance(record, dict) else None
            reason = f"record of a push that never committed, written {iso_ms(int(info.mtime * 1000))}"
            found.setdefault(what, []).append((info.key, reason, info.size))
    return found


def _record_id(key: str) -> str:
    return key.rsplit("/", 1)[1].removesuffix(".json")
