"""``singerlake verify``: compare the lake's metadata with what storage holds (fsck, SPEC.md §12).

Listing and manifests are compared on the driver (streams on a small thread pool); the blake2 hash
of every referenced file of every stream is computed on Spark executors in one job, so a lake of
many small streams costs one Spark job, and a stream of 100,000 files is checked in parallel.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from singerlake.commits.lock import looks_stale, read_lock
from singerlake.files.check import verify_files
from singerlake.format import catalogue as cat
from singerlake.format.errors import InvalidMetadata
from singerlake.format.layout import DATA_SUFFIX, LOCK, PART_DIR, PART_SUFFIX, RAW, ROOT_METADATA, StreamPaths, catalogue_key
from singerlake.format.manifest import Manifest
from singerlake.format.metadata import new_digest
from singerlake.format.parts import PartStore
from singerlake.lake import Lake
from singerlake.spark.runner import Failures, Progress, StreamFailure, for_each_stream, run_stream_items
from singerlake.storage import NotFound, ObjectInfo, Storage
from singerlake.text import counted
from singerlake.times import iso_ms, now_ms


@dataclass(frozen=True)
class Finding:
    kind: str  # missing | orphan | size_mismatch | hash_mismatch | version_without_files | stale_lock | metadata
    path: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.path}: {self.detail}"

    def to_dict(self) -> dict:
        return asdict(self)


def file_hash(storage: Storage, item: dict) -> dict:
    """Executor side: size and blake2 of one stored file (None when it is gone)."""
    digest, size = new_digest(), 0
    try:
        with storage.open_read(item["path"]) as stored:
            while chunk := stored.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    except NotFound:
        return {"size": None, "hash": None}
    return {"size": size, "hash": digest.hexdigest()}


def is_part_key(paths: StreamPaths, key: str) -> bool:
    return key.startswith(f"{paths.stream_dir}/{PART_DIR}/") and key.endswith(PART_SUFFIX)


def stream_listing(storage: Storage, paths: StreamPaths) -> dict[str, ObjectInfo]:
    return {info.key: info for info in storage.list(f"{paths.stream_dir}/")}


def read_manifest(lake: Lake, paths: StreamPaths) -> tuple[Manifest | None, Finding | None]:
    """The stream's whole manifest, every part read, or the finding that says why there is none."""
    try:
        data = lake.storage.read(paths.manifest).data
    except NotFound:
        return None, Finding("metadata", paths.manifest, "manifest.json is missing (repair rebuilds it from the data files)")
    try:
        manifest = Manifest.from_bytes(data, paths.manifest, PartStore(lake.storage, paths))
        _ = manifest.files, manifest.activate_versions  # a part missing or invalid makes the manifest invalid
        return manifest, None
    except InvalidMetadata as exc:
        return None, Finding("metadata", paths.manifest, f"invalid: {exc}")


def verify_stream(lake: Lake, tap_id: str, stream: str, listing: dict[str, ObjectInfo]) -> tuple[list[Finding], list[dict]]:
    """Findings from metadata and listing alone, and the referenced files whose hash is still to check."""
    paths = lake.paths(tap_id, stream)
    findings: list[Finding] = []
    manifest, problem = read_manifest(lake, paths)
    if problem:
        findings.append(problem)
    referenced = {e["path"]: e for e in manifest.files} if manifest else {}
    replaced = {r["path"] for r in manifest.replaced_files()} if manifest else set()
    to_hash = []
    for path, entry in referenced.items():
        info = listing.get(path)
        if info is None:
            findings.append(Finding("missing", path, f"in the manifest (commit {entry['commit']}) but not on storage"))
        elif info.size != entry["size"]:
            findings.append(Finding("size_mismatch", path, f"{counted(info.size, 'byte')} on storage, the manifest says {entry['size']:,}"))
        else:
            to_hash.append(entry)
    if manifest:
        named_parts = {paths.part(s["id"]) for s in manifest.parts + manifest.superseded}
        for path, info in listing.items():
            written = iso_ms(int(info.mtime * 1000))
            if path.endswith(DATA_SUFFIX) and path not in referenced and path not in replaced:
                findings.append(Finding("orphan", path, f"on storage but in no manifest (written {written}); vacuum removes it"))
            elif is_part_key(paths, path) and path not in named_parts:
                findings.append(Finding("orphan", path, f"a manifest part the root does not name (written {written}); vacuum removes it"))
        used = {e["schema_hash"] for e in manifest.files}
        for schema_hash, version in manifest.versions.items():
            if schema_hash not in used:
                findings.append(
                    Finding("version_without_files", paths.schema_dir(schema_hash), f"version {version['version']} has no files")
                )
    findings += stale_locks(lake.storage, listing)
    return findings, to_hash


def stale_locks(storage: Storage, listing: dict[str, ObjectInfo], now: int | None = None) -> list[Finding]:
    now = now_ms() if now is None else now
    found = []
    for path in listing:
        if path.endswith(f"/{LOCK}"):
            info = read_lock(storage, path)
            if info is None:
                found.append(Finding("stale_lock", path, "unreadable lock file"))
            elif looks_stale(info, now):
                found.append(
                    Finding(
                        "stale_lock", path, f"held by {info.writer_id}, last refreshed {iso_ms(info.refreshed_ms)}, lease {info.lease_s:g}s"
                    )
                )
    return found


def verify_tap_metadata(lake: Lake, tap_id: str, streams: list[str]) -> list[Finding]:
    findings = []
    key = catalogue_key(tap_id)
    try:
        catalogue = cat.load(lake.storage.read(key).data, key, "catalogue")
        listed = {entry["tap_stream_id"] for entry in catalogue["streams"]}
        for stream in streams:
            if stream not in listed:
                findings.append(Finding("metadata", key, f"stream {stream!r} is on storage but not in the catalogue"))
    except NotFound:
        findings.append(Finding("metadata", key, "catalogue.json is missing"))
    except InvalidMetadata as exc:
        findings.append(Finding("metadata", key, f"invalid: {exc}"))
    return findings


def _root_findings(lake: Lake) -> tuple[set[str], list[Finding]]:
    """The taps singerlake.json registers, or the finding that says why it cannot tell."""
    try:
        return set(cat.load(lake.storage.read(ROOT_METADATA).data, ROOT_METADATA, "root")["taps"]), []
    except NotFound:
        return set(), [Finding("metadata", ROOT_METADATA, "singerlake.json is missing")]
    except InvalidMetadata as exc:
        return set(), [Finding("metadata", ROOT_METADATA, f"invalid: {exc}")]


def _hash_findings(to_hash: list[dict], hashes: list[dict | None]) -> list[Finding]:
    findings = []
    for entry, found in zip(to_hash, hashes, strict=True):
        if found is None:
            continue  # the item failed: its stream is reported as a failure
        if found["size"] is None:
            findings.append(Finding("missing", entry["path"], "disappeared during verify"))
        elif found["hash"] != entry["hash"]:
            findings.append(
                Finding("hash_mismatch", entry["path"], f"blake2 {found['hash']} on storage, the manifest says {entry['hash']}")
            )
    return findings


def verify(
    lake: Lake,
    spark=None,
    check_hashes: bool = True,
    progress: Progress | None = None,
    failures: list[StreamFailure] | None = None,
) -> list[Finding]:
    """Every difference between metadata and storage, each naming the path at fault.

    Streams are compared with their listings on the driver, then the hashes of every stream's files
    are checked in one Spark job; pushed files against their index (SPEC.md §14). A stream that
    cannot be checked (a storage error) is added to ``failures`` and the others are checked; without
    ``failures`` that raises StreamsFailed at the end.
    """
    lake.check_exists()
    found = Failures()
    landed = RAW in lake.storage.list_dirs("")  # a lake of pushed files alone has no singerlake.json
    registered, findings = _root_findings(lake) if landed else (set(), [])
    streams_of = {tap_id: lake.listed_streams(tap_id) for tap_id in lake.listed_taps()}

    def check(tap_id: str, stream: str) -> tuple[list[Finding], list[dict]]:
        return verify_stream(lake, tap_id, stream, stream_listing(lake.storage, lake.paths(tap_id, stream)))

    checked = for_each_stream([(tap, stream) for tap, streams in streams_of.items() for stream in streams], check, found)
    to_hash: list[dict] = []
    items: list[dict] = []  # one per entry to hash, naming its stream
    for tap_id, streams in streams_of.items():
        if registered and tap_id not in registered:
            findings.append(Finding("metadata", ROOT_METADATA, f"tap {tap_id!r} is on storage but not registered"))
        findings += verify_tap_metadata(lake, tap_id, streams)
        for stream in streams:
            stream_findings, stream_to_hash = checked.get((tap_id, stream), ([], []))
            findings += stream_findings
            to_hash += stream_to_hash
            items += [{"tap_id": tap_id, "stream": stream, "path": entry["path"]} for entry in stream_to_hash]
    if check_hashes and to_hash:
        hashes = run_stream_items(
            spark, items, functools.partial(file_hash, lake.storage), found, progress, sizes=[e["size"] for e in to_hash]
        )
        findings += _hash_findings(to_hash, hashes)
    findings += [Finding(p.kind, p.path, p.detail) for p in verify_files(lake.storage, check_hashes)]
    found.deliver(failures)
    return findings
