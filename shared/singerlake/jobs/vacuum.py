"""``singerlake vacuum``: delete data files no reader needs any more, once older than the retention.

Three kinds qualify: temp files of writes a crash interrupted (local storage); orphans (on
storage, in no manifest: a crashed or failed writer's files, parts of a lost seal), aged by their
storage time; and files compaction replaced, i.e. listed by a part superseded longer ago than the
retention and by nothing more recent (then that part too), so readers holding an older root keep
working for the retention period (SPEC.md §12). A file the current manifest
references is never deleted: the manifest is read again right before deleting. Dry-run unless
``apply``.

Pushed files (SPEC.md §14): bytes, records and index pointers of pushes that never committed.

Projections (SPEC.md §12): delta-rs's own vacuum deletes the table's files removed more than the
retention ago (and files no version references); staging parts and CSV twins the latest commit
does not reference go once older than the retention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from singerlake.errors import ConfigError
from singerlake.files.check import vacuum_files
from singerlake.format.layout import DATA_SUFFIX, StreamPaths
from singerlake.format.manifest import Manifest
from singerlake.format.names import encode_segment
from singerlake.jobs import delta
from singerlake.jobs.verify import is_part_key, read_manifest, stream_listing
from singerlake.lake import Lake
from singerlake.times import iso_ms, now_ms, parse_time_ms

DEFAULT_RETENTION_S = 7 * 24 * 3600


@dataclass(frozen=True)
class Deletion:
    path: str
    reason: str
    size: int

    def __str__(self) -> str:
        return f"{self.path}: {self.reason} ({self.size:,} bytes)"

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
    chosen = []
    for path, info in listing.items():
        written = int(info.mtime * 1000)
        if path.endswith(DATA_SUFFIX) and path not in keep:
            if path in replaced:
                chosen.append(Deletion(path, f"replaced by compaction at {replaced[path]}", info.size))
            elif written <= cutoff:
                chosen.append(Deletion(path, f"orphan written {iso_ms(written)}", info.size))
        elif is_part_key(paths, path) and path not in keep_parts:
            if path in expired_parts:
                chosen.append(Deletion(path, f"manifest part superseded by compaction at {expired_parts[path]}", info.size))
            elif written <= cutoff:
                chosen.append(Deletion(path, f"orphan manifest part written {iso_ms(written)}", info.size))
    for info in lake.storage.leftovers(f"{paths.stream_dir}/"):
        if info.mtime * 1000 <= cutoff:
            chosen.append(Deletion(info.key, f"partial write left by a crash at {iso_ms(int(info.mtime * 1000))}", info.size))
    if apply and (chosen or expired):
        chosen = _delete(lake, paths, chosen, {g["id"] for g in expired})
    return chosen


def _ms(timestamp: str, default: int) -> int:
    found = parse_time_ms(timestamp)
    return default if found is None else found


def _delete(lake: Lake, paths: StreamPaths, chosen: list[Deletion], expired: set[str]) -> list[Deletion]:
    """Delete data files, then parts, that the manifest (read again now) does not reference; then drop
    the expired ``superseded`` entries and the deleted ``replaced`` entries from the root."""
    fresh, _ = read_manifest(lake, paths)
    if fresh is None:
        return []
    still_referenced = {e["path"] for e in fresh.files} | {paths.part(s["id"]) for s in fresh.parts}
    deleted = [d for d in chosen if d.path not in still_referenced]
    for deletion in sorted(deleted, key=lambda d: is_part_key(paths, d.path)):  # data files first, then parts
        lake.storage.delete(deletion.path)
    gone = {d.path for d in deleted}

    def forget(manifest: Manifest) -> bool:
        before = (len(manifest.superseded), len(manifest.replaced))
        manifest.superseded = [g for g in manifest.superseded if g["id"] not in expired]
        manifest.replaced = [r for r in manifest.replaced if r["path"] not in gone]
        return (len(manifest.superseded), len(manifest.replaced)) != before

    lake.update_manifest(paths, forget, store=fresh.store)
    return deleted


def vacuum(lake: Lake, retention_s: float = DEFAULT_RETENTION_S, apply: bool = False, now: int | None = None) -> list[Deletion]:
    lake.check_exists()
    now = now_ms() if now is None else now
    found = []
    for tap_id in lake.listed_taps():
        for stream in lake.listed_streams(tap_id):
            found += vacuum_stream(lake, lake.paths(tap_id, stream), retention_s, apply, now)
            found += vacuum_projection(lake, tap_id, stream, retention_s, apply, now)
    cutoff = now - retention_s * 1000
    found += [Deletion(path, reason, size) for path, reason, size in vacuum_files(lake.storage, cutoff, apply)]
    return found


def vacuum_projection(lake: Lake, tap_id: str, stream: str, retention_s: float, apply: bool, now: int) -> list[Deletion]:
    key = delta.table_key(tap_id, stream)
    if not lake.storage.exists(f"{key}/_delta_log/00000000000000000000.json"):
        return []  # never projected (or only by an older version): nothing to tell current from old
    published = delta.latest(lake.storage, key)
    if published.state is None:
        return []
    sizes = {info.key: info.size for info in lake.storage.list(f"{key}/")}
    removed = published.table.vacuum(
        retention_hours=math.ceil(retention_s / 3600), dry_run=not apply, enforce_retention_duration=False, full=True
    )
    reason = "no longer in the Delta table's retained versions"
    chosen = [Deletion(f"{key}/{path}", reason, sizes.get(f"{key}/{path}", 0)) for path in removed]
    parts = published.state["parts"]
    current = {part["staging"] for part in parts} | {part["csv"] for part in parts if "csv" in part}
    cutoff = now - retention_s * 1000
    staging = f"staging/{encode_segment(tap_id)}/{encode_segment(stream)}/"
    for info in [*lake.storage.list(staging), *lake.storage.list(f"{key}/_csv/")]:
        if info.key not in current and info.mtime * 1000 <= cutoff:
            chosen.append(Deletion(info.key, "staging part or CSV no longer current", info.size))
            if apply:
                lake.storage.delete(info.key)
    return chosen
