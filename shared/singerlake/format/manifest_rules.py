"""What a manifest root document must hold (SPEC.md §5): its format names and spec versions, and the
check that names the field at fault."""

from __future__ import annotations

from typing import Any

from singerlake.format.errors import InvalidMetadata
from singerlake.format.metadata import check_spec_version
from singerlake.format.parts import validate_entry, validate_summary
from singerlake.format.schema_hash import is_schema_hash

MANIFEST_FORMAT = "singerlake-manifest-v2"
MANIFEST_FORMAT_1 = "singerlake-manifest"  # 1.x: every file inline; read, and rewritten as 2.0 by writers
SPEC_VERSION = "2.0"
HORIZON_SPEC_VERSION = "2.2"  # roots carrying ``vacuumed``: older readers and writers must refuse them (SPEC.md §15)


def validate_manifest(doc: Any, source: str) -> None:
    """Raise InvalidMetadata naming the manifest and the field at fault (2.0 roots, and 1.x manifests)."""

    def fail(problem: str) -> None:
        raise InvalidMetadata(f"{source}: {problem}")

    if not isinstance(doc, dict):
        fail("must be a JSON object")
    check_spec_version(doc, source, HORIZON_SPEC_VERSION)
    if doc.get("format") not in (MANIFEST_FORMAT, MANIFEST_FORMAT_1):
        fail(f"field 'format' must be {MANIFEST_FORMAT!r} (or 1.x {MANIFEST_FORMAT_1!r}), got {doc.get('format')!r}")
    for name in ("tap_id", "stream"):
        if not isinstance(doc.get(name), str) or not doc[name]:
            fail(f"field {name!r} must be a non-empty string")
    commits = doc.get("commits")
    if not _is_count(commits):
        fail(f"field 'commits' must be a non-negative integer, got {commits!r}")
    if not isinstance(doc.get("generation", ""), str):
        fail("field 'generation' must be a string")
    if "vacuumed" in doc and not (isinstance(doc["vacuumed"], str) and _is_id(doc["vacuumed"])):
        fail(f"field 'vacuumed' must be a file id (32 lower-case hex digits), got {doc['vacuumed']!r}")
    versions = doc.get("versions")
    if not isinstance(versions, dict):
        fail("field 'versions' must be an object of schema hash -> version")
    labels = set()
    for schema_hash, info in versions.items():
        where = f"versions[{schema_hash!r}]"
        if not is_schema_hash(schema_hash):
            fail(f"{where}: key is not a schema hash")
        if not isinstance(info, dict) or not isinstance(info.get("schema"), dict):
            fail(f"{where}: field 'schema' must be an object")
        if not isinstance(info.get("version"), str) or not info["version"].startswith("v") or not info["version"][1:].isdigit():
            fail(f"{where}: field 'version' must look like 'v1', got {info.get('version')!r}")
        if info["version"] in labels:
            fail(f"{where}: version label {info['version']} is used twice")
        labels.add(info["version"])
        if not isinstance(info.get("key_properties"), list):
            fail(f"{where}: field 'key_properties' must be a list")
        if not isinstance(info.get("first_seen"), str):
            fail(f"{where}: field 'first_seen' must be a timestamp string")
    files = doc.get("files")
    if not isinstance(files, list):
        fail("field 'files' must be a list")
    seen = set()
    for index, entry in enumerate(files):
        validate_entry(entry, f"{source}: files[{index}]", versions, commits)
        if entry["id"] in seen:
            fail(f"files[{index}]: duplicate file id {entry['id']}")
        seen.add(entry["id"])
    replaced = doc.get("replaced", [])
    if not isinstance(replaced, list) or not all(isinstance(r, dict) and isinstance(r.get("path"), str) for r in replaced):
        fail("field 'replaced' must be a list of {id, path, replaced_at, by_commit}")
    if not isinstance(doc.get("writers", {}), dict):
        fail("field 'writers' must be an object")
    activations = doc.get("activate_versions", [])
    if not isinstance(activations, list):
        fail("field 'activate_versions' must be a list")
    for index, entry in enumerate(activations):
        after = entry.get("after_commit") if isinstance(entry, dict) else None
        if not _is_count(after) or not after <= commits:
            fail(f"activate_versions[{index}]: field 'after_commit' must be an integer in 0..{commits}")
        if doc["format"] == MANIFEST_FORMAT and not _is_count(entry.get("records")):
            fail(f"activate_versions[{index}]: field 'records' must be a non-negative integer")
    if doc["format"] == MANIFEST_FORMAT_1:
        return
    parts = doc.get("parts")
    if not isinstance(parts, list):
        fail("field 'parts' must be a list of part summaries")
    for index, summary in enumerate(parts):
        validate_summary(summary, f"{source}: parts[{index}]", commits)
    superseded = doc.get("superseded")
    if not isinstance(superseded, list) or not all(isinstance(g, dict) and isinstance(g.get("id"), str) for g in superseded):
        fail("field 'superseded' must be a list of {id, superseded_at, by_commit}")


def _is_id(text: str) -> bool:
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
