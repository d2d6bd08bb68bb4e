"""The 1.1 manifest model, verbatim from before lake format 2.0: what a 1.x reader does with a 2.0 root (tests only)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from singerlake.format.errors import InvalidMetadata
from singerlake.format.metadata import validate_record
from singerlake.format.schema_hash import is_schema_hash
from singerlake.storage.base import Blob
from singerlake.times import file_id_ms, iso_ms

MANIFEST_FORMAT = "singerlake-manifest"
SPEC_VERSION = "1.1"


@dataclass
class Manifest:
    tap_id: str
    stream: str
    versions: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: list[dict[str, Any]] = field(default_factory=list)
    commits: int = 0
    writers: dict[str, dict[str, str]] = field(default_factory=dict)
    activate_versions: list[dict[str, Any]] = field(default_factory=list)
    replaced: list[dict[str, Any]] = field(default_factory=list)  # files swapped out by compaction, until vacuum
    generation: str | None = None  # set when the manifest is first written; a rebuild starts a new one
    # The bytes and etag this manifest was last read or written as (not part of the document).
    stored: Blob | None = field(default=None, compare=False, repr=False)

    # -- versions ---------------------------------------------------------------------------
    def add_version(self, schema_hash: str, schema: dict, key_properties: list[str], first_seen_ms: int) -> str:
        """Register a schema version (idempotent) and return its label ``vN``."""
        if schema_hash not in self.versions:
            self.versions[schema_hash] = {
                "version": f"v{len(self.versions) + 1}",
                "schema": schema,
                "key_properties": list(key_properties),
                "first_seen": iso_ms(first_seen_ms),
            }
        return self.versions[schema_hash]["version"]

    def start_generation(self) -> None:
        """A new numbering of commits: bookmarks taken against an older generation are refused."""
        self.generation = uuid.uuid4().hex

    def latest_hash(self) -> str | None:
        if not self.versions:
            return None
        return max(self.versions, key=lambda h: int(self.versions[h]["version"][1:]))

    # -- files ------------------------------------------------------------------------------
    def file_ids(self) -> set[str]:
        return {entry["id"] for entry in self.files}

    def append_commit(self, records: list[dict[str, Any]]) -> int:
        """Add records as one commit; ids already present are skipped (retries are idempotent)."""
        present = self.file_ids()
        new = [r for r in records if r["id"] not in present]
        if new:
            self.commits += 1
            self.files.extend({**r, "commit": self.commits} for r in new)
        return self.commits

    def replace_files(self, groups: list[tuple[list[str], dict[str, Any]]], replaced_at: str) -> int:
        """Swap each group of files for the one file holding their records, in one new commit.

        The new file takes the place of its group's first file; the old files are kept in
        ``replaced`` (for vacuum) and stay readable by anyone holding the previous manifest.
        """
        self.commits += 1
        first_of = {ids[0]: new for ids, new in groups}
        gone = {file_id for ids, _ in groups for file_id in ids}
        kept = []
        for entry in self.files:
            if entry["id"] in first_of:
                kept.append({**first_of[entry["id"]], "commit": self.commits})
            if entry["id"] in gone:
                self.replaced.append({"id": entry["id"], "path": entry["path"], "replaced_at": replaced_at, "by_commit": self.commits})
            else:
                kept.append(entry)
        self.files = kept
        return self.commits

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "spec_version": SPEC_VERSION,
            "tap_id": self.tap_id,
            "stream": self.stream,
            "commits": self.commits,
            **({"generation": self.generation} if self.generation else {}),
            "versions": self.versions,
            "writers": self.writers,
            "activate_versions": self.activate_versions,
            "replaced": self.replaced,
            "files": self.files,
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, source: str) -> Manifest:
        try:
            doc = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidMetadata(f"{source}: not valid JSON: {exc}") from None
        return cls.from_dict(doc, source)

    @classmethod
    def from_dict(cls, doc: Any, source: str) -> Manifest:
        validate_manifest(doc, source)
        return cls(
            doc["tap_id"],
            doc["stream"],
            doc["versions"],
            doc["files"],
            doc["commits"],
            doc.get("writers", {}),
            doc.get("activate_versions", []),
            doc.get("replaced", []),
            doc.get("generation"),
        )


def versions_from_files(files: list[dict], schemas: dict[str, tuple[dict, list[str]]]) -> dict[str, dict]:
    """Versions numbered by the first file of each schema hash (used by rebuilds)."""
    manifest = Manifest("", "")
    for entry in sorted(files, key=lambda e: e["id"]):
        schema, keys = schemas[entry["schema_hash"]]
        manifest.add_version(entry["schema_hash"], schema, keys, file_id_ms(entry["id"]))
    return manifest.versions


def validate_manifest(doc: Any, source: str) -> None:
    """Raise InvalidMetadata naming the manifest and the field at fault."""

    def fail(problem: str) -> None:
        raise InvalidMetadata(f"{source}: {problem}")

    if not isinstance(doc, dict):
        fail("must be a JSON object")
    if doc.get("format") != MANIFEST_FORMAT:
        fail(f"field 'format' must be {MANIFEST_FORMAT!r}, got {doc.get('format')!r}")
    for name in ("tap_id", "stream"):
        if not isinstance(doc.get(name), str) or not doc[name]:
            fail(f"field {name!r} must be a non-empty string")
    commits = doc.get("commits")
    if not _is_count(commits):
        fail(f"field 'commits' must be a non-negative integer, got {commits!r}")
    if not isinstance(doc.get("generation", ""), str):
        fail("field 'generation' must be a string")
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
        where = f"files[{index}]"
        validate_record(entry, f"{source}: {where}")
        if entry["id"] in seen:
            fail(f"{where}: duplicate file id {entry['id']}")
        seen.add(entry["id"])
        if entry["schema_hash"] not in versions:
            fail(f"{where}: schema_hash {entry['schema_hash']} has no entry in 'versions'")
        commit = entry.get("commit")
        if not _is_count(commit) or not 1 <= commit <= commits:
            fail(f"{where}: field 'commit' must be an integer in 1..{commits}, got {commit!r}")
        if "runs" in entry:
            _validate_runs(entry, f"{source}: {where}")
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


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _validate_runs(entry: dict, where: str) -> None:
    """``runs``: the record positions a compacted file holds, ascending, adding up to its records (SPEC.md §11)."""
    runs = entry["runs"]
    if not isinstance(runs, list) or not runs:
        raise InvalidMetadata(f"{where}: field 'runs' must be a non-empty list")
    previous = (0, 0)
    for index, run in enumerate(runs):
        ok = isinstance(run, dict) and all(_is_count(run.get(k)) for k in ("commit", "first", "records"))
        if not ok or run["records"] == 0 or not 1 <= run["commit"] <= entry["commit"]:
            raise InvalidMetadata(f"{where}: runs[{index}] must be {{commit: 1..{entry['commit']}, first: int >= 0, records: int >= 1}}")
        if (run["commit"], run["first"]) < previous:
            raise InvalidMetadata(f"{where}: runs[{index}] is out of order (runs must ascend by commit, then first)")
        previous = (run["commit"], run["first"] + run["records"])
    if sum(run["records"] for run in runs) != entry["records"]:
        raise InvalidMetadata(
            f"{where}: field 'runs' adds up to {sum(r['records'] for r in runs)} records, 'records' says {entry['records']}"
        )
