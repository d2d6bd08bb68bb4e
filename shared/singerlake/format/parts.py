"""Manifest parts (SPEC.md §5): immutable, create-only objects holding sealed file entries or
activations, each summarised in the stream's root so that readers open only the parts they need.

This module knows a part's document, its summary, where parts may be cut, and how parts are
stored; ``manifest.Manifest`` decides when to seal and which parts a read needs.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from typing import Any

import msgspec

from singerlake.format.errors import InvalidMetadata
from singerlake.format.layout import StreamPaths
from singerlake.format.metadata import check_spec_version, validate_record
from singerlake.format.positions import commit_span, entry_runs
from singerlake.storage import NotFound, PreconditionFailed, Storage

PART_FORMAT = "singerlake-manifest-part"
PART_SPEC_VERSION = "2.0"
# Seal bounds: the tail's entries as JSON. With ~400-byte entries and ~300-byte summaries the root
# stays under 1 MiB up to about a million files (SPEC.md §5).
TAIL_FILE_BYTES = 384 << 10
TAIL_ACTIVATION_BYTES = 64 << 10


def cut(files: list[dict], max_bytes: int) -> list[list[dict]]:
    """``files`` in consecutive chunks of about ``max_bytes`` of JSON, cut only where every position
    before the cut is in an earlier commit than every position after it (the cut rule, SPEC.md §5)."""
    spans = [commit_span(entry) for entry in files]
    lowest_after = [0] * len(files)
    low = None
    for index in range(len(files) - 1, -1, -1):
        low = spans[index][0] if low is None else min(low, spans[index][0])
        lowest_after[index] = low
    chunks, current, size, highest = [], [], 0, -1
    for index, entry in enumerate(files):
        if current and size >= max_bytes and highest < lowest_after[index]:
            chunks.append(current)
            current, size = [], 0
        current.append(entry)
        size += len(_encode(entry))
        highest = max(highest, spans[index][1])
    if current:
        chunks.append(current)
    return chunks


def summarise(part_id: str, files: list[dict], activations: list[dict]) -> dict[str, Any]:
    """The root's summary of a part: enough to decide, unopened, whether a read needs it."""
    summary: dict[str, Any] = {"id": part_id}
    if files:
        placed = entry_runs(files)
        summary["commits"] = [min(r.commit for _, runs in placed for r in runs), max(r.commit for _, runs in placed for r in runs)]
        last = max((runs[-1].commit, runs[-1].first + runs[-1].records) for _, runs in placed)
        summary["last"] = list(last)
        summary["start"] = min(e["start"] for e in files)
        summary["end"] = max(e["end"] for e in files)
        plain = [e["id"] for e in files if "runs" not in e]
        if plain:
            summary["ids"] = [min(plain), max(plain)]
        versions: dict[str, list[int]] = {}
        for entry in files:
            counts = versions.setdefault(entry["schema_hash"], [0, 0, 0])
            counts[0] += 1
            counts[1] += entry["records"]
            counts[2] += entry["size"]
        summary["versions"] = versions
    else:
        after = [a["after_commit"] for a in activations]
        summary["commits"] = [min(after), max(after)]
    summary["activations"] = len(activations)
    return summary


def validate_summary(summary: Any, where: str, commits: int) -> None:
    def fail(problem: str) -> None:
        raise InvalidMetadata(f"{where}: {problem}")

    if not isinstance(summary, dict) or not isinstance(summary.get("id"), str) or len(summary["id"]) != 32:
        fail("must be an object with a 32-digit part 'id'")
    span = summary.get("commits")
    if not (isinstance(span, list) and len(span) == 2 and all(_is_count(c) for c in span) and span[0] <= span[1] <= commits):
        fail(f"field 'commits' must be [lo, hi] with lo <= hi <= {commits}, got {span!r}")
    if not _is_count(summary.get("activations")):
        fail("field 'activations' must be a non-negative integer")
    if "versions" in summary:
        for name in ("start", "end"):
            if not _is_count(summary.get(name)):
                fail(f"field {name!r} must be a non-negative integer")
        last = summary.get("last")
        if not (isinstance(last, list) and len(last) == 2 and all(_is_count(c) for c in last)):
            fail("field 'last' must be [commit, records]")
        if not isinstance(summary["versions"], dict):
            fail("field 'versions' must be an object of schema hash -> [files, records, bytes]")
    elif summary["activations"] == 0:
        fail("holds neither files ('versions') nor activations")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def validate_entry(entry: Any, where: str, versions: dict, commits: int) -> None:
    """A file entry: the datalake record, a known schema hash, its commit and its runs (SPEC.md §5, §11)."""
    validate_record(entry, where)
    if entry["schema_hash"] not in versions:
        raise InvalidMetadata(f"{where}: schema_hash {entry['schema_hash']} has no entry in 'versions'")
    commit = entry.get("commit")
    if not _is_count(commit) or not 1 <= commit <= commits:
        raise InvalidMetadata(f"{where}: field 'commit' must be an integer in 1..{commits}, got {commit!r}")
    if "runs" in entry:
        _validate_runs(entry, where)
    if not isinstance(entry.get("needs", {}), dict):
        raise InvalidMetadata(f"{where}: field 'needs' must be an object of property -> need")
    undeclared = entry.get("undeclared", [])
    listed = isinstance(undeclared, list) and all(isinstance(name, str) for name in undeclared)
    if not listed or ("undeclared" in entry and "needs" not in entry):
        raise InvalidMetadata(f"{where}: field 'undeclared' must be a list of names, beside 'needs'")


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


def _encode(doc: Any) -> bytes:
    return msgspec.json.encode(doc)  # compact UTF-8 JSON, several times faster than json.dumps


@dataclass(frozen=True)
class Part:
    files: list[dict]
    activations: list[dict]


def encode_part(paths: StreamPaths, part: Part) -> bytes:
    doc = {
        "format": PART_FORMAT,
        "spec_version": PART_SPEC_VERSION,
        "tap_id": paths.tap_id,
        "stream": paths.stream,
        "files": part.files,
        "activate_versions": part.activations,
    }
    return gzip.compress(_encode(doc), compresslevel=6, mtime=0)


def decode_part(data: bytes, source: str, summary: dict, versions: dict, commits: int) -> Part:
    """A part's content, validated against the root's versions and, for a current part, its summary."""
    try:
        doc = msgspec.json.decode(gzip.decompress(data))
    except (OSError, EOFError, msgspec.DecodeError) as exc:
        raise InvalidMetadata(f"{source}: not a gzipped JSON part: {exc}") from None
    if isinstance(doc, dict):
        check_spec_version(doc, source, PART_SPEC_VERSION)
    if not isinstance(doc, dict) or doc.get("format") != PART_FORMAT:
        raise InvalidMetadata(f"{source}: field 'format' must be {PART_FORMAT!r}")
    files, activations = doc.get("files"), doc.get("activate_versions")
    if not isinstance(files, list) or not isinstance(activations, list):
        raise InvalidMetadata(f"{source}: fields 'files' and 'activate_versions' must be lists")
    lo, hi = summary.get("commits", (0, commits))  # a superseded part has no summary any more
    for index, entry in enumerate(files):
        validate_entry(entry, f"{source}: files[{index}]", versions, commits)
        low, high = commit_span(entry)
        if not lo <= low <= high <= hi:
            raise InvalidMetadata(f"{source}: files[{index}]: its commits lie outside the part's range {lo}..{hi}")
    for index, activation in enumerate(activations):
        if not isinstance(activation, dict) or not lo <= activation.get("after_commit", -1) <= hi:
            raise InvalidMetadata(f"{source}: activate_versions[{index}]: 'after_commit' outside the part's range {lo}..{hi}")
    counts = (sum(c[0] for c in summary.get("versions", {}).values()), summary["activations"]) if "commits" in summary else None
    if counts is not None and counts != (len(files), len(activations)):
        raise InvalidMetadata(f"{source}: holds {len(files)} files and {len(activations)} activations, its summary says otherwise")
    return Part(files, activations)


class PartStore:
    """Reads and writes one stream's parts; parts never change, so each is read at most once."""

    def __init__(self, storage: Storage, paths: StreamPaths):
        self.storage, self.paths = storage, paths
        self._cache: dict[str, Part] = {}
        self._lock = threading.Lock()

    def read(self, summary: dict, versions: dict, commits: int) -> Part:
        part_id = summary["id"]
        with self._lock:
            if part_id in self._cache:
                return self._cache[part_id]
        key = self.paths.part(part_id)
        try:
            data = self.storage.read(key).data
        except NotFound:
            raise InvalidMetadata(f"{self.storage.url_of(key)}: manifest part is missing, though the root lists it") from None
        part = decode_part(data, self.storage.url_of(key), summary, versions, commits)
        with self._lock:
            self._cache[part_id] = part
        return part

    def write(self, part_id: str, part: Part) -> None:
        """Create-only (SPEC.md §5): a part is complete on storage before any root names it."""
        try:
            self.storage.write(self.paths.part(part_id), encode_part(self.paths, part), if_none_match=True)
        except PreconditionFailed:
            raise InvalidMetadata(f"{self.storage.url_of(self.paths.part(part_id))}: part id used twice") from None
        with self._lock:
            self._cache[part_id] = part
