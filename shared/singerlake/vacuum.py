"""``singerlake vacuum``: delete data files no reader needs any more, once older than the retention.

Three kinds qualify: temp files of writes a crash interrupted (local storage); orphans (on
storage, in no manifest: a crashed or failed writer's files), aged by their storage time; and
files compaction replaced (the manifest's ``replaced``), aged from the replacement, so readers
holding the older manifest keep working for the retention period. A file the current manifest
references is never deleted: the manifest is read again right before deleting. Dry-run unless
``apply``.

Projections (SPEC.md §12): delta-rs's own vacuum deletes the table's files removed more than the
retention ago (and files no version references); staging parts and CSV twins the latest commit
does not reference go once older than the retention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from singerlake import delta
from singerlake.lake import Lake
from singerlake.manifest import Manifest
from singerlake.paths import DATA_SUFFIX, StreamPaths, encode_segment, iso_ms, now_ms
from singerlake.singer_file import parse_time_ms
from singerlake.verify import read_manifest, stream_listing

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
        raise ValueError(f"retention {text!r} is not a duration like 7d, 12h, 30m or 45s") from None


def vacuum_stream(lake: Lake, paths: StreamPaths, retention_s: float, apply: bool, now: int) -> list[Deletion]:
    manifest, problem = read_manifest(lake, paths)
    if problem:
        return []  # without a manifest every file looks unreferenced: never guess, repair first
    cutoff = now - retention_s * 1000
    listing = stream_listing(lake.storage, paths)
    referenced = {e["path"] for e in manifest.files}
    replaced = {r["path"]: r for r in manifest.replaced}
    chosen = []
    for path, info in listing.items():
        if not path.endswith(DATA_SUFFIX) or path in referenced:
            continue
        if path in replaced:
            when = parse_time_ms(replaced[path]["replaced_at"]) or now
            reason = f"replaced by compaction at {replaced[path]['replaced_at']}"
        else:
            when = int(info.mtime * 1000)
            reason = f"orphan written {iso_ms(when)}"
        if when <= cutoff:
            chosen.append(Deletion(path, reason, info.size))
    for info in lake.storage.leftovers(f"{paths.stream_dir}/"):
        if info.mtime * 1000 <= cutoff:
            chosen.append(Deletion(info.key, f"partial write left by a crash at {iso_ms(int(info.mtime * 1000))}", info.size))
    if apply and chosen:
        chosen = _delete(lake, paths, chosen)
    return chosen


def _delete(lake: Lake, paths: StreamPaths, chosen: list[Deletion]) -> list[Deletion]:
    fresh, _ = read_manifest(lake, paths)
    still_referenced = {e["path"] for e in fresh.files} if fresh else {d.path for d in chosen}
    deleted = [d for d in chosen if d.path not in still_referenced]
    for deletion in deleted:
        lake.storage.delete(deletion.path)
    gone = {d.path for d in deleted}

    def forget(manifest: Manifest) -> bool:
        kept = [r for r in manifest.replaced if r["path"] not in gone]
        changed = len(kept) != len(manifest.replaced)
        manifest.replaced = kept
        return changed

    lake.update_manifest(paths, forget)
    return deleted


def vacuum(lake: Lake, retention_s: float = DEFAULT_RETENTION_S, apply: bool = False, now: int | None = None) -> list[Deletion]:
    lake.check_exists()
    now = now_ms() if now is None else now
    found = []
    for tap_id in lake.listed_taps():
        for stream in lake.listed_streams(tap_id):
            found += vacuum_stream(lake, lake.paths(tap_id, stream), retention_s, apply, now)
            found += vacuum_projection(lake, tap_id, stream, retention_s, apply, now)
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
