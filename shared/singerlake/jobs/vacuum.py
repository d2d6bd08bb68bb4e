"""``singerlake vacuum``: delete data files no reader needs any more, once older than the retention.

Three kinds qualify: temp files of writes a crash interrupted (local storage); orphans (on
storage, in no manifest: a crashed or failed writer's files, parts of a lost seal), aged by their
storage time; and files compaction replaced, i.e. listed by a part superseded longer ago than the
retention and by nothing more recent (then that part too), so readers holding an older root keep
working for the retention period (SPEC.md §12). Dry-run unless ``apply``.

What a writer may still commit is never deleted, whatever the retention (SPEC.md §15): a stream's
orphans go only after a swap of its root that raises the horizon ``vacuumed`` over them, so no
commit can name them any more; a table's files only after a fence commit, so no project run that
planned before can commit; pushed files' leftovers (``files.check``) only under the what's vacuum
lock, once no push holds a live lease on it.

Projections (SPEC.md §12): the files delta-rs's vacuum finds (a dry run) that no retained Iceberg
snapshot lists; staging parts and CSV twins the latest commit does not reference, once older than
the retention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from singerlake import changes
from singerlake.commits.commit import update_manifest
from singerlake.commits.errors import LockTimeout
from singerlake.commits.lock import Lock, looks_stale, read_lock
from singerlake.errors import ConfigError
from singerlake.files.check import vacuum_files
from singerlake.format.layout import DATA_SUFFIX, LOCK, PART_SUFFIX, DataFileName, StreamPaths
from singerlake.format.manifest import Manifest
from singerlake.format.names import encode_segment
from singerlake.jobs.verify import is_part_key, read_manifest, stream_listing
from singerlake.lake import Lake
from singerlake.storage import ObjectInfo, Storage
from singerlake.tables import delta, iceberg
from singerlake.tables.heads import raise_heads
from singerlake.text import counted
from singerlake.times import iso_ms, now_ms, parse_time_ms

DEFAULT_RETENTION_S = 7 * 24 * 3600
MIN_RETENTION_S = 3600  # under it, only with force: readers of older versions are what the retention protects


@dataclass(frozen=True)
class Deletion:
    path: str
    reason: str
    size: int

    def __str__(self) -> str:
        return f"{self.path}: {self.reason} ({counted(self.size, 'byte')})"

    def to_dict(self) -> dict:
        return {"path": self.path, "reason": self.reason, "size": self.size}


def parse_duration(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``45s`` or plain seconds."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise ConfigError(f"retention {text!r} is not a duration like 7d, 12h, 30m or 45s") from None


def vacuum_stream(lake: Lake, paths: StreamPaths, retention_s: float, apply: bool, now: int) -> list[Deletion]:
    manifest, problem = read_manifest(lake, paths)
    if problem:
        return []  # without a manifest every file looks unreferenced: never guess, repair first
    cutoff = now - retention_s * 1000
    listing = stream_listing(lake.storage, paths)
    expired = [g for g in manifest.superseded if _ms(g["superseded_at"], now) <= cutoff]
    recent = [g for g in manifest.superseded if g not in expired]
    # Files a reader may still need: the current manifest's, and those of parts superseded within the retention.
    keep = {e["path"] for e in manifest.files} | {e["path"] for g in recent for e in manifest.superseded_files(g)}
    keep |= {r["path"] for r in manifest.replaced if _ms(r["replaced_at"], now) > cutoff}
    replaced = {e["path"]: g["superseded_at"] for g in reversed(expired) for e in manifest.superseded_files(g)}
    replaced.update({r["path"]: r["replaced_at"] for r in manifest.replaced})
    keep_parts = {paths.part(s["id"]) for s in manifest.parts + recent}
    expired_parts = {paths.part(g["id"]): g["superseded_at"] for g in expired}
    live = live_writer_dirs(lake.storage, paths, listing, now)
    chosen, orphans = [], {}
    for path, info in listing.items():
        written = int(info.mtime * 1000)
        if path.endswith(DATA_SUFFIX) and path not in keep:
            if path in replaced:
                chosen.append(Deletion(path, f"replaced by compaction at {replaced[path]}", info.size))
            elif written <= cutoff and path.rsplit("/", 1)[0] not in live:
                chosen.append(Deletion(path, f"orphan written {iso_ms(written)}", info.size))
                orphans[path] = DataFileName.parse(path).file_id
        elif is_part_key(paths, path) and path not in keep_parts:
            if path in expired_parts:
                chosen.append(Deletion(path, f"manifest part superseded by compaction at {expired_parts[path]}", info.size))
            elif written <= cutoff:
                chosen.append(Deletion(path, f"orphan manifest part written {iso_ms(written)}", info.size))
                orphans[path] = path.rsplit("/", 1)[1].removesuffix(PART_SUFFIX)
    for info in lake.storage.stale_leftovers(f"{paths.stream_dir}/", cutoff):
        chosen.append(Deletion(info.key, f"partial write left by a crash at {iso_ms(int(info.mtime * 1000))}", info.size))
    if apply and (chosen or expired):
        chosen = _delete(lake, paths, manifest, chosen, orphans, {g["id"] for g in expired})
    return chosen


def live_writer_dirs(storage: Storage, paths: StreamPaths, listing: dict[str, ObjectInfo], now: int) -> set[str]:
    """The stream-schema directories whose lock is held and fresh: their orphans are left to a later
    pass, so a landing under way is not made to fail (a courtesy: the horizon is the guarantee)."""
    locks = [key for key in listing if key.endswith(f"/{LOCK}") and key.count("/") == paths.stream_dir.count("/") + 2]
    return {key.rsplit("/", 1)[0] for key in locks if not looks_stale(read_lock(storage, key), now)}


def _ms(timestamp: str, default: int) -> int:
    found = parse_time_ms(timestamp)
    return default if found is None else found


class _ManifestGone(Exception):
    """The manifest vanished while vacuum was deciding: touch nothing."""


def _delete(
    lake: Lake, paths: StreamPaths, read: Manifest, chosen: list[Deletion], orphans: dict[str, str], expired: set[str]
) -> list[Deletion]:
    """One swap of the root, then the deletes (SPEC.md §15): on the root as it is now, drop what it
    names from ``chosen``, raise its horizon ``vacuumed`` to the greatest orphan id left (so no commit
    can name those any more), and drop the expired ``superseded`` and deleted ``replaced`` entries.
    Data files are deleted before parts."""
    deleting: list[Deletion] = []

    def fence(manifest: Manifest) -> bool:
        named = {e["path"] for e in manifest.files} | {paths.part(s["id"]) for s in manifest.parts}
        deleting[:] = [d for d in chosen if d.path not in named]
        gone = {d.path for d in deleting}
        horizon = max([orphans[path] for path in gone if path in orphans] + [manifest.vacuumed or ""])
        before = (len(manifest.superseded), len(manifest.replaced), manifest.vacuumed)
        manifest.superseded = [g for g in manifest.superseded if g["id"] not in expired]
        manifest.replaced = [r for r in manifest.replaced if r["path"] not in gone]
        manifest.vacuumed = horizon or None
        return (len(manifest.superseded), len(manifest.replaced), manifest.vacuumed) != before

    def vanished() -> Manifest:
        raise _ManifestGone

    try:
        update_manifest(lake.storage, paths, fence, seed=vanished, store=read.store)
    except _ManifestGone:
        return []
    for deletion in sorted(deleting, key=lambda d: is_part_key(paths, d.path)):  # data files first, then parts
        lake.storage.delete(deletion.path)
    return deleting


def check_retention(retention_s: float, force: bool) -> None:
    if retention_s < MIN_RETENTION_S and not force:
        raise ConfigError(
            f"retention {retention_s:g}s is under the safe minimum of 1h: a reader still reading an older manifest or table "
            "version could lose files it is reading (no writer loses data at any retention); pass --force to vacuum anyway"
        )


def vacuum(
    lake: Lake,
    retention_s: float = DEFAULT_RETENTION_S,
    apply: bool = False,
    now: int | None = None,
    force: bool = False,
    iceberg_catalog: str | None = None,
    notes: list[str] | None = None,
) -> list[Deletion]:
    """What vacuum deletes (with ``apply``) or would delete. ``force``: accept a retention under 1 h.
    ``iceberg_catalog``: the pyiceberg catalog of the Iceberg tables, whose snapshots older than the
    retention are then expired. ``notes`` collects what was left for a later pass, and why."""
    check_retention(retention_s, force)
    lake.check_exists()
    catalog = iceberg.open_catalog(iceberg_catalog, lake.storage) if iceberg_catalog else None
    now = now_ms() if now is None else now
    notes = [] if notes is None else notes
    found = []
    for tap_id in lake.listed_taps():
        for stream in lake.listed_streams(tap_id):
            found += vacuum_stream(lake, lake.paths(tap_id, stream), retention_s, apply, now)
            found += vacuum_projection(lake, tap_id, stream, retention_s, apply, now, catalog, notes)
        found += vacuum_changes(lake.storage, tap_id, now - max(retention_s * 1000, changes.KEEP_MS), apply)
    cutoff = now - retention_s * 1000
    found += [Deletion(path, reason, size) for path, reason, size in vacuum_files(lake.storage, cutoff, apply, notes)]
    return found


def vacuum_changes(storage: Storage, tap_id: str, cutoff: float, apply: bool) -> list[Deletion]:
    """The tap's change markers older than the retention and than 2 days (SPEC.md §16): no reader needs them."""
    old = changes.old_markers(storage, tap_id, int(cutoff))
    for info in old if apply else []:
        storage.delete(info.key)
    return [Deletion(info.key, "change marker older than the retention", info.size) for info in old]


def vacuum_projection(
    lake: Lake, tap_id: str, stream: str, retention_s: float, apply: bool, now: int, catalog=None, notes: list[str] | None = None
) -> list[Deletion]:
    """The table's files no retained Delta version nor Iceberg snapshot lists, and staging parts and
    CSV twins the latest state does not name, once older than the retention; deleted only after the
    fence commit (SPEC.md §15). A table whose Iceberg lock is held is left for a later pass."""
    notes = [] if notes is None else notes
    key = delta.table_key(tap_id, stream)
    if not lake.storage.exists(f"{key}/_delta_log/00000000000000000000.json"):
        return []  # never projected (or only by an older version): nothing to tell current from old
    published = delta.latest(lake.storage, key)
    if published.state is None:
        return []
    listing = {info.key: info for info in lake.storage.list(f"{key}/")}
    if not any(k.startswith(f"{key}/_iceberg/") for k in listing):
        return _vacuum_table(lake, tap_id, stream, published, listing, retention_s, apply, now, set(), notes)
    try:
        with Lock(lake.storage, iceberg.lock_key(key), writer_prefix="vacuum", wait_s=0):
            keep = iceberg.retained_files(lake.storage, catalog, tap_id, stream, now - retention_s * 1000, apply)
            return _vacuum_table(lake, tap_id, stream, published, listing, retention_s, apply, now, keep, notes)
    except LockTimeout:
        notes.append(f"{key}: an Iceberg commit holds its lock; the table is left for a later vacuum")
        return []


def _vacuum_table(lake, tap_id, stream, published, listing, retention_s, apply, now, keep: set[str], notes: list[str]) -> list[Deletion]:
    key = delta.table_key(tap_id, stream)
    removed = delta.open_table(lake.storage, key, published.version).vacuum(
        retention_hours=math.ceil(retention_s / 3600), dry_run=True, enforce_retention_duration=False, full=True
    )
    reason = "no longer in the Delta table's retained versions"
    found = [f"{key}/{path}" for path in removed]
    chosen = [Deletion(k, reason, listing[k].size if k in listing else 0) for k in found if iceberg.file_uri(lake.storage, k) not in keep]
    parts = published.state["parts"]
    current = {part["staging"] for part in parts} | {part["csv"] for part in parts if "csv" in part}
    cutoff = now - retention_s * 1000
    staging = f"staging/{encode_segment(tap_id)}/{encode_segment(stream)}/"
    for info in [*lake.storage.list(staging), *lake.storage.list(f"{key}/_csv/")]:
        if info.key not in current and info.mtime * 1000 <= cutoff:
            chosen.append(Deletion(info.key, "staging part or CSV no longer current", info.size))
    if apply and chosen:
        if not delta.fence(lake.storage, key, published):
            notes.append(f"{key}: a project run committed meanwhile; the table is left for a later vacuum")
            return []
        raise_heads(lake.storage, tap_id, {stream: published.version + 1})  # so the next run plans from the fence
        for deletion in chosen:
            lake.storage.delete(deletion.path)
    return chosen
