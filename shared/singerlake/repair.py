"""``singerlake repair``: rebuild missing or invalid metadata from the data files (SPEC.md §7, §12).

A valid manifest is kept as it is: its orphans are **not** adopted. An orphan is usually a batch
whose writer crashed before committing; the tap then resent those records from its last STATE and
they were landed again, so adopting the orphan would duplicate them. Orphans are left for vacuum.
Every change is committed with the same compare-and-swap as the target's commits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from singerlake import catalogue as cat
from singerlake.commit import compare_and_swap
from singerlake.jobs import Progress, run_items
from singerlake.lake import Lake
from singerlake.manifest import Manifest
from singerlake.metadata import InvalidMetadata
from singerlake.paths import ROOT_METADATA, StreamPaths, catalogue_key
from singerlake.scan import data_file_keys, describe_file, manifest_from_described
from singerlake.singer_file import CorruptFile
from singerlake.storage import NotFound, Storage
from singerlake.verify import read_manifest


@dataclass(frozen=True)
class Action:
    path: str
    change: str

    def __str__(self) -> str:
        return f"{self.path}: {self.change}"

    def to_dict(self) -> dict:
        return {"path": self.path, "change": self.change}


def describe_on_executor(storage: Storage, item: dict) -> dict:
    try:
        record, schema, keys = describe_file(storage, StreamPaths(item["tap_id"], item["stream"]), item["path"])
    except (CorruptFile, ValueError) as exc:
        return {"error": str(exc)}
    return {"described": [record, schema, keys]}


def rebuild_manifest(lake: Lake, paths: StreamPaths, spark, progress: Progress | None) -> tuple[Manifest, list[Action]]:
    """The manifest a scan of the stream's data files gives (read on the executors); unreadable files are left out."""
    keys = data_file_keys(lake.storage, paths)
    items = [{"tap_id": paths.tap_id, "stream": paths.stream, "path": key} for key in keys]
    results = run_items(spark, items, functools.partial(describe_on_executor, lake.storage), progress)
    skipped = [Action(item["path"], f"not adopted: {r['error']}") for item, r in zip(items, results, strict=True) if "error" in r]
    described = [tuple(r["described"]) for r in results if "described" in r]
    return manifest_from_described(paths, described), skipped


def _replace_with(storage: Storage, key: str, new: bytes) -> None:
    compare_and_swap(storage, key, lambda current: None if current == new else new)


def repair(lake: Lake, spark, apply: bool = False, progress: Progress | None = None) -> list[Action]:
    """What repair changes (all of it when ``apply``; nothing otherwise)."""
    lake.check_exists()
    actions: list[Action] = []
    for tap_id in lake.listed_taps():
        catalogue: dict = {"streams": []}
        for stream in lake.listed_streams(tap_id):
            paths = lake.paths(tap_id, stream)
            manifest, problem = read_manifest(lake, paths)
            if problem:
                manifest, skipped = rebuild_manifest(lake, paths, spark, progress)
                manifest.start_generation()  # commits are renumbered: readers' old bookmarks must not apply
                actions.append(Action(paths.manifest, f"rebuild from {len(manifest.files)} data files ({problem.detail})"))
                actions += skipped
                if apply:
                    _replace_with(lake.storage, paths.manifest, manifest.to_bytes())
            if manifest.versions:
                catalogue = cat.upsert_stream(catalogue, cat.catalog_entry(manifest, paths.stream_dir))
        actions += _rewrite_if_changed(lake, catalogue_key(tap_id), catalogue, "catalogue", apply)
    root = lake.rebuild_root_metadata(keep=_current_root(lake))
    actions += _rewrite_if_changed(lake, ROOT_METADATA, root, "root", apply)
    return actions


def _current_root(lake: Lake) -> dict | None:
    """The current singerlake.json when readable: its annotations cannot be rebuilt, so they are kept."""
    try:
        return cat.load(lake.storage.read(ROOT_METADATA).data, ROOT_METADATA, "root")
    except (NotFound, InvalidMetadata):
        return None


def _rewrite_if_changed(lake: Lake, key: str, wanted: dict, kind: str, apply: bool) -> list[Action]:
    try:
        current = cat.load(lake.storage.read(key).data, key, kind)
        if current == wanted:
            return []
        why = "out of date with the manifests"
    except NotFound:
        why = "missing"
    except InvalidMetadata as exc:
        why = f"invalid ({exc})"
    if apply:
        _replace_with(lake.storage, key, cat.dump(wanted))
    return [Action(key, f"rewrite ({why})")]
