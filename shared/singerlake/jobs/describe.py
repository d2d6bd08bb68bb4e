"""``singerlake ls`` / ``describe``: what the lake holds, from its metadata (or a scan), and its locks."""

from __future__ import annotations

import json

from singerlake.commits.lock import looks_stale, read_lock
from singerlake.format.layout import LOCK
from singerlake.format.manifest import Manifest
from singerlake.lake import Lake
from singerlake.tables.columns import published_table
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


def describe_lake(lake: Lake) -> dict:
    """Taps, streams, versions (with diffs), files, records, bytes, time span, locks, and each projected
    stream's table (``table``: location, version, rows, columns with JSON-text and chosen ones marked)."""
    taps = {}
    for tap_id in lake.taps():
        taps[tap_id] = {}
        for stream in lake.streams(tap_id):
            manifest = lake.manifest(tap_id, stream)
            table = published_table(lake.storage, manifest)
            taps[tap_id][stream] = describe_stream(lake, tap_id, stream, manifest) | ({"table": table} if table else {})
    return {"root": lake.storage.url, "taps": taps, "files": describe_files(lake)}


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
