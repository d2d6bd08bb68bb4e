"""A stream's manifest (SPEC.md §5): a small root, the commit point, in front of immutable parts."""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec

from singerlake.format.errors import InvalidMetadata
from singerlake.format.manifest_rules import HORIZON_SPEC_VERSION, MANIFEST_FORMAT, MANIFEST_FORMAT_1, SPEC_VERSION, validate_manifest
from singerlake.format.parts import (
    TAIL_ACTIVATION_BYTES,
    TAIL_FILE_BYTES,
    Part,
    PartStore,
    cut,
    summarise,
)
from singerlake.format.positions import entry_runs
from singerlake.storage.base import Blob
from singerlake.times import file_id_ms, iso_ms, new_file_id


@dataclass
class ReadPlan:
    """What a read from a bookmark or in a time window needs, from the parts it opened and the tail."""

    files: list[dict[str, Any]]  # in the stream's order; whole commits (SPEC.md §5 cut rule)
    activations: list[dict[str, Any]]  # those with after_commit >= the bookmark's commit, in order
    passed: tuple[int, int]  # the position just after the last record of the file parts skipped by the window
    parts_opened: int


@dataclass
class Manifest:
    """A stream's manifest (SPEC.md §5): the root (the commit point) and, behind it, its parts.

    ``files`` and ``activate_versions`` are the whole stream (every part is read, once); readers
    that need less use ``plan``, ``summary`` and ``end_position``, which read only what they need.
    """

    tap_id: str
    stream: str
    versions: dict[str, dict[str, Any]] = field(default_factory=dict)
    tail: list[dict[str, Any]] = field(default_factory=list)  # files committed since the last seal
    commits: int = 0
    writers: dict[str, dict[str, str]] = field(default_factory=dict)
    tail_activations: list[dict[str, Any]] = field(default_factory=list)
    replaced: list[dict[str, Any]] = field(default_factory=list)  # only in manifests upgraded from 1.x
    generation: str | None = None  # set when the manifest is first written; a rebuild starts a new one
    parts: list[dict[str, Any]] = field(default_factory=list)  # summaries, in the stream's order
    superseded: list[dict[str, Any]] = field(default_factory=list)  # parts compaction replaced, until vacuum
    vacuumed: str | None = None  # the horizon (SPEC.md §15): no commit adds a file entry with an id at or below it
    # The bytes and etag this manifest's root was last read or written as (not part of the document).
    stored: Blob | None = field(default=None, compare=False, repr=False)
    store: PartStore | None = field(default=None, compare=False, repr=False)
    _unwritten: list[tuple[str, Part]] = field(default_factory=list, compare=False, repr=False)
    _tail_index: tuple[tuple[int, int], set[str], int] | None = field(default=None, compare=False, repr=False)
    read_format: str = field(default=MANIFEST_FORMAT, compare=False, repr=False)  # 1.x roots are read too (SPEC.md §13)

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

    # -- parts -------------------------------------------------------------------------------
    def _read(self, summary: dict) -> Part:
        for part_id, part in self._unwritten:  # staged by this change, written with the root
            if part_id == summary["id"]:
                return part
        if self.store is None:
            raise InvalidMetadata(f"manifest of {self.stream!r}: its parts cannot be read (no storage attached)")
        return self.store.read(summary, self.versions, self.commits)

    def _file_parts(self) -> list[dict]:
        return [s for s in self.parts if "versions" in s]

    def _activation_parts(self) -> list[dict]:
        return [s for s in self.parts if s["activations"]]

    # -- the whole stream --------------------------------------------------------------------
    @property
    def files(self) -> list[dict[str, Any]]:
        """Every committed file, in the stream's order (reads every part)."""
        return [entry for s in self._file_parts() for entry in self._read(s).files] + self.tail

    def files_overlapping(self, start: int, end: int) -> list[dict[str, Any]]:
        """Committed files whose record times overlap ``start``..``end`` (ms): only the parts whose
        summaries overlap are read."""
        parts = [s for s in self._file_parts() if s["start"] <= end and s["end"] >= start]
        entries = [e for s in parts for e in self._read(s).files] + self.tail
        return [e for e in entries if e["start"] <= end and e["end"] >= start]

    @property
    def activate_versions(self) -> list[dict[str, Any]]:
        return [a for s in self._activation_parts() for a in self._read(s).activations] + self.tail_activations

    def file_ids(self) -> set[str]:
        return {entry["id"] for entry in self.files}

    def replaced_files(self) -> list[dict[str, Any]]:
        """Data files compaction took out that vacuum has not deleted yet: ``{"path", "replaced_at", "part"}``
        (``part``: the superseded part listing it; None for ``replaced`` entries from 1.x)."""
        current = {entry["path"] for entry in self.files}
        found: dict[str, dict] = {r["path"]: {"path": r["path"], "replaced_at": r["replaced_at"], "part": None} for r in self.replaced}
        for gone in self.superseded:
            for entry in self.superseded_files(gone):
                if entry["path"] not in current:
                    found.setdefault(entry["path"], {"path": entry["path"], "replaced_at": gone["superseded_at"], "part": gone["id"]})
        return list(found.values())

    def superseded_files(self, gone: dict) -> list[dict]:
        """The files a superseded part lists ([] when vacuum deleted it already)."""
        try:
            return self.store.read(gone, self.versions, self.commits).files
        except InvalidMetadata:
            return []

    # -- summaries: no part is read ---------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Per schema hash ``[files, records, bytes]``, and the stream's earliest and latest record time."""
        versions: dict[str, list[int]] = {h: [0, 0, 0] for h in self.versions}
        starts, ends = [], []
        for s in self._file_parts():
            for schema_hash, counts in s["versions"].items():
                versions[schema_hash] = [a + b for a, b in zip(versions[schema_hash], counts, strict=True)]
            starts.append(s["start"])
            ends.append(s["end"])
        for entry in self.tail:
            counts = versions[entry["schema_hash"]]
            counts[0], counts[1], counts[2] = counts[0] + 1, counts[1] + entry["records"], counts[2] + entry["size"]
            starts.append(entry["start"])
            ends.append(entry["end"])
        return {"versions": versions, "start": min(starts, default=None), "end": max(ends, default=None)}

    def file_count(self) -> int:
        return sum(counts[0] for counts in self.summary()["versions"].values())

    def end_position(self) -> tuple[int, int]:
        """The position just after the stream's last record ((0, 0) when it has none)."""
        ends = [tuple(s["last"]) for s in self._file_parts()]
        ends += [(runs[-1].commit, runs[-1].first + runs[-1].records) for _, runs in entry_runs(self.tail)]
        return max(ends, default=(0, 0))

    # -- planned reads -------------------------------------------------------------------------
    def plan(self, after_commit: int | None = None, window: Any = None, until_commit: int | None = None) -> ReadPlan:
        """The files and activations a read after commit ``after_commit`` (records of earlier commits
        are done) needs, opening only the parts whose summaries may hold them. ``window``: an object
        whose ``misses(start_end)`` says a time span lies outside it; file parts it misses are skipped
        unopened (SPEC.md §11). ``until_commit``: files whose first position is later are not needed."""
        after = after_commit or 0
        files: list[dict] = []
        activations: list[dict] = []
        passed, opened = (0, 0), 0
        for s in self.parts:
            lo, hi = s["commits"]
            if hi < after or (until_commit is not None and lo > until_commit and not s["activations"]):
                continue
            if "versions" in s and window is not None and window.misses(s):
                passed = max(passed, tuple(s["last"]))
                continue
            part = self._read(s)
            opened += 1
            files += part.files
            activations += [a for a in part.activations if a["after_commit"] >= after]
        activations += [a for a in self.tail_activations if a["after_commit"] >= after]
        return ReadPlan(files + self.tail, activations, passed, opened)

    # -- commits -------------------------------------------------------------------------------
    def _tail_ids_and_bytes(self) -> tuple[set[str], int]:
        """The tail's ids and its size as JSON, kept up to date while commits append to the same tail."""
        key = (id(self.tail), len(self.tail))
        if self._tail_index is None or self._tail_index[0] != key:
            self._tail_index = (key, {entry["id"] for entry in self.tail}, len(_encode(self.tail)))
        return self._tail_index[1], self._tail_index[2]

    def copy(self) -> Manifest:
        """An independent copy to change (entries are never changed in place, so they are shared)."""
        copied = dataclasses.replace(
            self,
            versions=dict(self.versions),
            tail=list(self.tail),
            writers=dict(self.writers),
            tail_activations=list(self.tail_activations),
            replaced=list(self.replaced),
            parts=list(self.parts),
            superseded=list(self.superseded),
            _unwritten=[],
            _tail_index=None,
        )
        if self._tail_index is not None and self._tail_index[0] == (id(self.tail), len(self.tail)):
            copied._tail_index = ((id(copied.tail), len(copied.tail)), set(self._tail_index[1]), self._tail_index[2])
        copied.read_format, copied.stored = self.read_format, self.stored
        return copied

    def present_ids(self, ids: set[str]) -> set[str]:
        """Which of ``ids`` the stream holds as written: the tail, and only the parts whose id range covers one."""
        found = ids & self._tail_ids_and_bytes()[0]
        for s in self._file_parts():
            low, high = s.get("ids", ("", ""))
            if any(low <= file_id <= high for file_id in ids - found):
                found |= {entry["id"] for entry in self._read(s).files if entry["id"] in ids}
        return found

    def append_commit(self, records: list[dict[str, Any]]) -> int:
        """Add records as one commit; ids already present are skipped (retries are idempotent)."""
        present = self.present_ids({r["id"] for r in records})
        new = [r for r in records if r["id"] not in present]
        if new:
            tail_ids, size = self._tail_ids_and_bytes()
            self.commits += 1
            added = [{**r, "commit": self.commits} for r in new]
            self.tail.extend(added)
            tail_ids.update(r["id"] for r in added)
            self._tail_index = ((id(self.tail), len(self.tail)), tail_ids, size + sum(len(_encode(r)) + 1 for r in added))
        return self.commits

    def commit_records(self, commit: int) -> int:
        """How many records ``commit`` made visible (their positions are ``(commit, 0..n-1)``)."""
        files = list(self.tail)
        for s in self._file_parts():
            if s["commits"][0] <= commit <= s["commits"][1]:
                files = self._read(s).files + files
        return sum(run.records for _, runs in entry_runs(files) for run in runs if run.commit == commit)

    def add_activation(self, version: int, received: str) -> None:
        """Record an ACTIVATE_VERSION at the current end of the stream."""
        place = {"version": version, "after_commit": self.commits, "records": self.commit_records(self.commits)}
        self.tail_activations.append({**place, "received": received})

    def replace_files(self, groups: list[tuple[list[str], dict[str, Any]]], replaced_at: str) -> int:
        """Swap each group of files for the one file holding their records, in one new commit.

        The tail is sealed first; each run of consecutive parts holding sources is rewritten into new
        parts (the new file in place of its group's first file) and the old parts are superseded:
        they stay readable by anyone holding the previous root, and list the replaced files for vacuum.
        """
        self.commits += 1
        self.seal(force=True)
        first_of = {ids[0]: new for ids, new in groups}
        gone = {file_id for ids, _ in groups for file_id in ids}
        rewritten: list[dict] = []
        affected: list[dict] = []

        def rewrite() -> None:
            entries = []
            for s in affected:
                for entry in self._read(s).files:
                    if entry["id"] in first_of:
                        entries.append({**first_of[entry["id"]], "commit": self.commits})
                    if entry["id"] not in gone:
                        entries.append(entry)
                self.superseded.append({"id": s["id"], "superseded_at": replaced_at, "by_commit": self.commits})
            rewritten.extend(self._stage(chunk, []) for chunk in cut(entries, TAIL_FILE_BYTES) if chunk)
            affected.clear()

        for s in self.parts:
            if "versions" in s and any(entry["id"] in gone for entry in self._read(s).files):
                affected.append(s)
                continue
            if affected:
                rewrite()
            rewritten.append(s)
        if affected:
            rewrite()
        self.parts = rewritten
        return self.commits

    def add_statistics(self, found: dict[str, dict], at: str) -> int:
        """Give the entries of ids in ``found`` that have no ``needs`` the column statistics ``found``
        holds for them (SPEC.md §5, §12 repair); returns how many changed. Tail entries change in
        place; each part holding such entries is staged again with them (same entries, same order,
        a new id) and the old one superseded. No commit: positions, commits and generation stay."""
        wanted = set(found)

        def updated(entries: list[dict]) -> list[dict]:
            return [{**e, **found[e["id"]]} if e["id"] in wanted and "needs" not in e else e for e in entries]

        changed = sum(1 for e in self.tail if e["id"] in wanted and "needs" not in e)
        if changed:
            self.tail = updated(self.tail)
        parts = []
        for s in self.parts:
            files = self._read(s).files if "versions" in s else []
            count = sum(1 for e in files if e["id"] in wanted and "needs" not in e)
            if count:
                self.superseded.append({"id": s["id"], "superseded_at": at, "by_commit": self.commits})
                s = self._stage(updated(files), [])
                changed += count
            parts.append(s)
        self.parts = parts
        return changed

    # -- sealing -------------------------------------------------------------------------------
    def seal(self, force: bool = False) -> None:
        """Move the tail into new parts once it outgrows its bound (or always, with ``force``);
        likewise the activations. The parts are written by ``write_parts``, before the root."""
        if self.tail and (force or self._tail_ids_and_bytes()[1] > TAIL_FILE_BYTES):
            self.parts += [self._stage(chunk, []) for chunk in cut(self.tail, TAIL_FILE_BYTES)]
            self.tail = []
        if self.tail_activations and (force or len(_encode(self.tail_activations)) > TAIL_ACTIVATION_BYTES):
            self.parts.append(self._stage([], self.tail_activations))
            self.tail_activations = []

    def below_horizon(self, ids) -> list[str]:
        """Which of ``ids`` (of new file entries or parts) vacuum may have deleted as orphans (SPEC.md §15)."""
        return sorted(i for i in ids if self.vacuumed is not None and i <= self.vacuumed)

    def staged_part_ids(self) -> list[str]:
        """The parts staged by seals and compactions, not yet written."""
        return [part_id for part_id, _ in self._unwritten]

    def _stage(self, files: list[dict], activations: list[dict]) -> dict:
        part_id = new_file_id()
        self._unwritten.append((part_id, Part(files, activations)))
        return summarise(part_id, files, activations)

    def write_parts(self) -> None:
        """Write the parts staged by seals and compactions (create-only), before the root that names them."""
        if self._unwritten and self.store is None:
            raise InvalidMetadata(f"manifest of {self.stream!r}: parts to write but no storage attached")
        for part_id, part in self._unwritten:
            self.store.write(part_id, part)
        self._unwritten = []

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The root document (parts are written by ``write_parts``)."""
        return {
            "format": MANIFEST_FORMAT,
            "spec_version": SPEC_VERSION if self.vacuumed is None else HORIZON_SPEC_VERSION,
            "tap_id": self.tap_id,
            "stream": self.stream,
            "commits": self.commits,
            **({"generation": self.generation} if self.generation else {}),
            "versions": self.versions,
            "writers": self.writers,
            "parts": self.parts,
            "files": self.tail,
            "activate_versions": self.tail_activations,
            "superseded": self.superseded,
            **({"replaced": self.replaced} if self.replaced else {}),
            **({"vacuumed": self.vacuumed} if self.vacuumed is not None else {}),
        }

    def to_bytes(self) -> bytes:
        return _encode(self.to_dict())

    @classmethod
    def from_bytes(cls, data: bytes, source: str, store: PartStore | None = None) -> Manifest:
        try:
            doc = msgspec.json.decode(data)
        except msgspec.DecodeError as exc:
            raise InvalidMetadata(f"{source}: not valid JSON: {exc}") from None
        return cls.from_dict(doc, source, store)

    @classmethod
    def from_dict(cls, doc: Any, source: str, store: PartStore | None = None) -> Manifest:
        validate_manifest(doc, source)
        manifest = cls(
            doc["tap_id"],
            doc["stream"],
            doc["versions"],
            doc["files"],
            doc["commits"],
            doc.get("writers", {}),
            doc.get("activate_versions", []),
            doc.get("replaced", []),
            doc.get("generation"),
            doc.get("parts", []),
            doc.get("superseded", []),
            doc.get("vacuumed"),
            store=store,
        )
        manifest.read_format = doc["format"]
        if doc["format"] == MANIFEST_FORMAT_1:  # 1.x: place each activation from the files (SPEC.md §13)
            sizes: Counter[int] = Counter()
            for _, runs in entry_runs(manifest.tail):
                for run in runs:
                    sizes[run.commit] += run.records
            manifest.tail_activations = [{**a, "records": sizes[a["after_commit"]]} for a in manifest.tail_activations]
        return manifest


def _encode(doc: Any) -> bytes:
    return msgspec.json.encode(doc)  # compact UTF-8 JSON, several times faster than json.dumps


def versions_from_files(files: list[dict], schemas: dict[str, tuple[dict, list[str]]]) -> dict[str, dict]:
    """Versions numbered by the first file of each schema hash (used by rebuilds)."""
    manifest = Manifest("", "")
    for entry in sorted(files, key=lambda e: e["id"]):
        schema, keys = schemas[entry["schema_hash"]]
        manifest.add_version(entry["schema_hash"], schema, keys, file_id_ms(entry["id"]))
    return manifest.versions
