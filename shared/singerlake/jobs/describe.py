"""``singerlake ls`` / ``describe``: what the lake holds, from its metadata (or a scan), and its locks."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from singerlake.changes.view import Entry, read_view, to_visit, updated, view_key, write_view
from singerlake.commits.lock import looks_stale, read_lock
from singerlake.format.layout import LOCK
from singerlake.format.manifest import Manifest
from singerlake.lake import Lake
from singerlake.storage import Storage
from singerlake.tables.columns import published_table
from singerlake.tables.heads import read_heads
from singerlake.times import iso_ms, now_ms


def type_text(spec: dict) -> str:
    """A property's JSON schema type in a few words: ``string (date-time)``, ``integer|null``."""
    kind = spec.get("type", spec.get("anyOf", "any"))
    if isinstance(kind, str):
        text = kind
    elif isinstance(kind, list) and all(isinstance(k, str) for k in kind):
        text = "|".join(kind)
    else:
        text = json.dumps(kind, sort_keys=True)
    return text + (f" ({spec['format']})" if "format" in spec else "")


def schema_changes(old: dict, new: dict) -> list[dict]:
    """Changes between two versions, each ``{"kind": "keys"|"added"|"removed"|"changed", "name", "before", "after"}``."""
    changes = []
    if old["key_properties"] != new["key_properties"]:
        changes.append({"kind": "keys", "name": None, "before": old["key_properties"], "after": new["key_properties"]})
    before, after = old["schema"].get("properties", {}), new["schema"].get("properties", {})
    for name in sorted(set(before) | set(after)):
        if name not in before:
            changes.append({"kind": "added", "name": name, "before": None, "after": type_text(after[name])})
        elif name not in after:
            changes.append({"kind": "removed", "name": name, "before": type_text(before[name]), "after": None})
        elif before[name] != after[name]:
            changes.append({"kind": "changed", "name": name, "before": type_text(before[name]), "after": type_text(after[name])})
    return changes


def schema_diff(old: dict, new: dict) -> list[str]:
    """Readable changes between two versions: ``+ email: string``, ``- name``, ``~ id: integer -> string``."""
    text = {
        "keys": "key properties {before} -> {after}",
        "added": "+ {name}: {after}",
        "removed": "- {name}",
        "changed": "~ {name}: {before} -> {after}",
    }
    return [text[c["kind"]].format(**c) for c in schema_changes(old, new)] or ["no property changes (other schema keywords differ)"]


def stream_locks(lake: Lake, tap_id: str, stream: str, now: int | None = None) -> list[dict]:
    now = now_ms() if now is None else now
    found = []
    for info in lake.storage.list(f"{lake.paths(tap_id, stream).stream_dir}/"):
        if info.key.endswith(f"/{LOCK}"):
            lock = read_lock(lake.storage, info.key)
            stale = looks_stale(lock, now)
            found.append(
                {
                    "path": info.key,
                    "tap_id": tap_id,
                    "stream": stream,
                    "writer_id": lock.writer_id if lock else None,
                    "refreshed": iso_ms(lock.refreshed_ms) if lock else None,
                    "stale": stale,
                }
            )
    return found


def describe_stream(lake: Lake, tap_id: str, stream: str, manifest: Manifest) -> dict:
    """From the manifest's root alone: part summaries and the tail (no part is read)."""
    summary = manifest.summary()
    by_version = sorted(manifest.versions.items(), key=lambda item: int(item[1]["version"][1:]))
    versions = []
    for index, (schema_hash, info) in enumerate(by_version):
        files, records, _ = summary["versions"][schema_hash]
        versions.append(
            {
                "version": info["version"],
                "schema_hash": schema_hash,
                "first_seen": info["first_seen"],
                "files": files,
                "records": records,
                "changes": schema_diff(by_version[index - 1][1], info) if index else [],
            }
        )
    totals = [sum(counts[i] for counts in summary["versions"].values()) for i in range(3)]
    return {
        "versions": versions,
        "files": totals[0],
        "records": totals[1],
        "bytes": totals[2],
        "commits": manifest.commits,
        "start": iso_ms(summary["start"]) if summary["start"] is not None else None,
        "end": iso_ms(summary["end"]) if summary["end"] is not None else None,
        "locks": stream_locks(lake, tap_id, stream),
    }


def describe_lake(lake: Lake, views: Storage | None = None) -> dict:
    """Taps, streams, versions (with diffs), files, records, bytes, time span, locks, and each projected
    stream's table (``table``: location, version, rows, columns with JSON-text and chosen ones marked).
    With ``views`` (where this machine keeps ``ls``'s views of the lake), a tap's streams are described
    again only when its change log names them or their table's head moved (SPEC.md §16); the others, their
    locks too, are as the view kept them (``locks_read``: when their locks were listed). ``read``: this run."""
    now = now_ms()
    taps = {}
    for tap_id in lake.taps():
        if views is None:
            taps[tap_id] = described_streams(lake, tap_id, lake.streams(tap_id), now)
        else:
            taps[tap_id] = described_tap(lake, tap_id, views, now)
    return {"root": lake.storage.url, "read": iso_ms(now), "taps": taps, "files": describe_files(lake)}


def described(lake: Lake, tap_id: str, stream: str, now: int) -> dict:
    """A stream as ``ls`` shows it: its manifest's summary, its locks and its published table."""
    manifest = lake.manifest(tap_id, stream)
    table = published_table(lake.storage, manifest)
    described = describe_stream(lake, tap_id, stream, manifest) | {"locks_read": iso_ms(now)}
    return described | ({"table": table} if table else {})


def described_streams(lake: Lake, tap_id: str, streams: list[str], now: int) -> dict[str, dict]:
    """``described`` of each stream, side by side as the storage serves well (S3: a few requests per stream)."""
    with ThreadPoolExecutor(lake.storage.parallel_requests) as pool:
        return dict(zip(streams, pool.map(lambda stream: described(lake, tap_id, stream, now), streams), strict=True))


def described_tap(lake: Lake, tap_id: str, views: Storage, now: int) -> dict[str, dict]:
    """A tap's streams from its view, those to visit described again (every stream without a view); the view written back."""
    key, url = view_key("", tap_id), lake.storage.url
    view = read_view(views, key, "ls", url, tap_id)
    heads = read_heads(lake.storage, tap_id)  # before the streams: a table that moves meanwhile is read again next run
    visit = to_visit(lake.storage, tap_id, view, heads.tables if heads.read else None)
    if view is None or visit.streams is None:
        wanted = lake.streams(tap_id)
    else:
        wanted = sorted(visit.streams)
    computed = {stream: Entry(doc, heads.get(stream)) for stream, doc in described_streams(lake, tap_id, wanted, now).items()}
    kept = updated(view, visit, computed)
    write_view(views, key, kept, "ls", url, tap_id)
    return {stream: entry.doc for stream, entry in kept.streams.items()}


def describe_files(lake: Lake) -> dict:
    """Per what of pushed files (SPEC.md §14): its wheres, files, bytes, pushes and first and last day."""
    from singerlake.files.check import states
    from singerlake.files.layout import index_dir

    whats = {}
    for state in states(lake.storage):
        records = list(state.records.values())
        days = lake.storage.list_dirs(f"{index_dir(state.what)}/day/")
        whats[state.what] = {
            "wheres": sorted({r["where"] for r in records}),
            "files": len(records),
            "bytes": sum(r["size"] for r in records),
            "pushes": len(state.segments),
            "first_day": days[0] if days else None,
            "last_day": days[-1] if days else None,
        }
    return whats
