"""A tap's ``catalogue.json`` (a Singer catalog) and the lake's ``raw/singerlake.json`` (SPEC.md §6)."""

from __future__ import annotations

import copy
import json
from typing import Any

from singerlake.errors import ConfigError
from singerlake.format.errors import InvalidMetadata
from singerlake.format.manifest import SPEC_VERSION, Manifest
from singerlake.format.metadata import check_spec_version

ROOT_FORMAT = "singerlake"
ANNOTATIONS = ("owner", "description", "docs_url", "logs_url")


def catalog_entry(manifest: Manifest, stream_dir: str) -> dict[str, Any]:
    """The Singer catalog entry of a stream's latest schema version."""
    latest = manifest.latest_hash()
    version = manifest.versions[latest]
    return {
        "tap_stream_id": manifest.stream,
        "stream": manifest.stream,
        "schema": version["schema"],
        "key_properties": version["key_properties"],
        "metadata": [
            {
                "breadcrumb": [],
                "metadata": {
                    "table-key-properties": version["key_properties"],
                    "singerlake-schema-hash": latest,
                    "singerlake-version": version["version"],
                    "singerlake-path": stream_dir,
                },
            }
        ],
    }


def dump(doc: dict) -> bytes:
    return json.dumps(doc, ensure_ascii=False, indent=1, sort_keys=True).encode("utf-8")


def load(data: bytes, source: str, expect: str) -> dict:
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidMetadata(f"{source}: not valid JSON: {exc}") from None
    if expect == "catalogue":
        if not isinstance(doc, dict) or not isinstance(doc.get("streams"), list):
            raise InvalidMetadata(f"{source}: field 'streams' must be a list of Singer catalog entries")
        for index, entry in enumerate(doc["streams"]):
            if not isinstance(entry, dict) or not isinstance(entry.get("tap_stream_id"), str) or not isinstance(entry.get("schema"), dict):
                raise InvalidMetadata(f"{source}: streams[{index}] needs 'tap_stream_id' and 'schema'")
    else:
        if isinstance(doc, dict):
            check_spec_version(doc, source, SPEC_VERSION)
        if not isinstance(doc, dict) or doc.get("format") != ROOT_FORMAT or not isinstance(doc.get("taps"), dict):
            raise InvalidMetadata(f"{source}: must have 'format': {ROOT_FORMAT!r} and a 'taps' object")
    return doc


def upsert_stream(catalogue: dict, entry: dict) -> dict:
    return upsert_streams(catalogue, [entry])


def upsert_streams(catalogue: dict, entries: list[dict]) -> dict:
    by_stream = {s["tap_stream_id"]: s for s in catalogue.get("streams", [])}
    by_stream.update((entry["tap_stream_id"], entry) for entry in entries)
    return {"streams": [by_stream[name] for name in sorted(by_stream)]}


def empty_root() -> dict:
    return {"format": ROOT_FORMAT, "spec_version": SPEC_VERSION, "taps": {}}


def upsert_tap(root: dict, tap_id: str, tap_dir: str, annotations: dict[str, Any] | None = None) -> dict:
    """Add the tap; given annotations replace old ones, absent ones keep what was there."""
    taps = dict(root.get("taps", {}))
    entry = {"path": tap_dir, **{name: None for name in ANNOTATIONS}, **taps.get(tap_id, {})}
    for name, value in (annotations or {}).items():
        if name not in ANNOTATIONS:
            raise ConfigError(f"unknown tap annotation {name!r}; expected one of {ANNOTATIONS}")
        if value is not None:
            entry[name] = value
    taps[tap_id] = entry
    return {**root, "spec_version": SPEC_VERSION, "taps": dict(sorted(taps.items()))}


def replay_schema(manifest: Manifest) -> dict[str, Any]:
    """One schema every stored record of the stream fits: the latest version's, plus the
    properties that only older versions had (a reader replaying old files must not drop them)."""
    ordered = sorted(manifest.versions.values(), key=lambda v: int(v["version"][1:]), reverse=True)
    merged = copy.deepcopy(ordered[0]["schema"])
    properties = merged.setdefault("properties", {})
    for older in ordered[1:]:
        for name, spec in older["schema"].get("properties", {}).items():
            properties.setdefault(name, copy.deepcopy(spec))
    return merged
