"""``singerlake repair``: rebuild missing or invalid metadata from the data files (SPEC.md §7, §12).

A valid manifest is kept as it is: its orphans are **not** adopted. An orphan is usually a batch
whose writer crashed before committing; the tap then resent those records from its last STATE and
they were landed again, so adopting the orphan would duplicate them. Orphans are left for vacuum.
Every change is committed with the same compare-and-swap as the target's commits. The data files of
every stream to rebuild are read in one Spark job.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from singerlake.commits.commit import compare_and_swap, write_manifest
from singerlake.files.check import repair_files
from singerlake.format import catalogue as cat
from singerlake.format.errors import CorruptFile, InvalidMetadata
from singerlake.format.layout import PART_DIR, PART_SUFFIX, RAW, ROOT_METADATA, StreamPaths, catalogue_key
from singerlake.format.manifest import Manifest
from singerlake.format.scan import data_file_keys, describe_file, manifest_from_described
from singerlake.jobs.verify import Finding, read_manifest
from singerlake.lake import Lake
from singerlake.spark.runner import Failures, Progress, StreamFailure, by_stream, for_each_stream, run_stream_items
from singerlake.storage import NotFound, Storage
from singerlake.tables.statistics import add_statistics, missing_items, statistics_on_executor
from singerlake.times import now_ms


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
        record, schema, keys = describe_file(storage, StreamPaths(item["tap_id"], item["stream"]), item["path"], with_needs=True)
    except (CorruptFile, ValueError) as exc:
        return {"error": str(exc)}
    return {"described": [record, schema, keys]}


def repair_item(storage: Storage, item: dict) -> dict:
    """Executor side: a data file to scan (a rebuild), or an entry to find column statistics for."""
    return statistics_on_executor(storage, item) if "entry" in item else describe_on_executor(storage, item)


@dataclass
class _StreamPlan:
    """A stream's manifest as read, and when it is missing or invalid, why and the data files to rebuild it from."""

    manifest: Manifest | None
    problem: Finding | None
    scan_items: list[dict]  # data files to rebuild from, or entries without column statistics (SPEC.md §5)


def _plan_stream(lake: Lake, tap_id: str, stream: str) -> _StreamPlan:
    paths = lake.paths(tap_id, stream)
    manifest, problem = read_manifest(lake, paths)
    if not problem:
        return _StreamPlan(manifest, None, missing_items(manifest, tap_id, stream))
    keys = data_file_keys(lake.storage, paths)
    return _StreamPlan(None, problem, [{"tap_id": tap_id, "stream": stream, "path": key} for key in keys])


def _rebuild(lake: Lake, tap_id: str, stream: str, plan: _StreamPlan, described: list[tuple[dict, dict]], apply: bool):
    """The manifest a scan of the stream's data files gives (read on the executors); unreadable files are left out."""
    paths = lake.paths(tap_id, stream)
    skipped = [Action(item["path"], f"not adopted: {r['error']}") for item, r in described if "error" in r]
    manifest = manifest_from_described(paths, [tuple(r["described"]) for _, r in described if "described" in r])
    manifest.start_generation()  # commits are renumbered: readers' old bookmarks must not apply
    actions = [Action(paths.manifest, f"rebuild from {len(manifest.files)} data files ({plan.problem.detail})"), *skipped]
    started = now_ms()
    old_parts = [info for info in lake.storage.list(f"{paths.stream_dir}/{PART_DIR}/") if info.key.endswith(PART_SUFFIX)]
    if apply:
        write_manifest(lake.storage, paths, manifest)  # sealed into parts as a 2.0 manifest (SPEC.md §5)
    named = {paths.part(summary["id"]) for summary in manifest.parts}
    for info in old_parts:
        # The lost root's parts: the rebuilt root names none of them, and no reader can reach them.
        # A part younger than this repair may be a live writer's seal: vacuum takes it if it stays unnamed.
        if info.key not in named and info.mtime * 1000 < started:
            actions.append(Action(info.key, "remove: a manifest part of the root this rebuild replaces"))
            if apply:
                lake.storage.delete(info.key)
    return manifest, actions


def _add_statistics(lake: Lake, tap_id: str, stream: str, plan: _StreamPlan, results: list[tuple[dict, dict]], apply: bool) -> list[Action]:
    """Entries of a valid manifest without column statistics get them (SPEC.md §12 repair)."""
    actions = [Action(item["entry"]["path"], f"no column statistics: {r['error']}") for item, r in results if "error" in r]
    found = sum(1 for _, r in results if "fields" in r)
    if found:
        changed = add_statistics(lake, tap_id, stream, results, plan.manifest) if apply else found
        if changed:
            actions.insert(0, Action(lake.paths(tap_id, stream).manifest, f"add column statistics to {changed} file entries"))
    return actions


def _replace_with(storage: Storage, key: str, new: bytes) -> None:
    compare_and_swap(storage, key, lambda current: None if current == new else new)


def repair(
    lake: Lake, spark, apply: bool = False, progress: Progress | None = None, failures: list[StreamFailure] | None = None
) -> list[Action]:
    """What repair changes (all of it when ``apply``; nothing otherwise).

    Every stream's manifest is read first; the data files of all streams whose manifest must be
    rebuilt are read in one Spark job. A stream that fails (a storage error) is added to
    ``failures`` and its tap's catalogue is left as it is; without ``failures``, StreamsFailed is
    raised at the end.
    """
    lake.check_exists()
    found = Failures()
    streams_of = {tap_id: lake.listed_streams(tap_id) for tap_id in lake.listed_taps()}
    selected = [(tap, stream) for tap, streams in streams_of.items() for stream in streams]
    plans = for_each_stream(selected, lambda tap, stream: _plan_stream(lake, tap, stream), found)
    items = [item for plan in plans.values() for item in plan.scan_items]
    described = by_stream(items, run_stream_items(spark, items, functools.partial(repair_item, lake.storage), found, progress))

    def settle(tap: str, stream: str) -> tuple[Manifest, list[Action]]:
        plan = plans[(tap, stream)]
        if plan.problem is None:
            return plan.manifest, _add_statistics(lake, tap, stream, plan, described.get((tap, stream), []), apply)
        return _rebuild(lake, tap, stream, plan, described.get((tap, stream), []), apply)

    settled = for_each_stream([s for s in plans if not found.has(*s)], settle, found)
    actions: list[Action] = []
    for tap_id, streams in streams_of.items():
        catalogue: dict = {"streams": []}
        for stream in streams:
            manifest, stream_actions = settled.get((tap_id, stream), (None, []))
            actions += stream_actions
            if manifest is not None and manifest.versions:
                catalogue = cat.upsert_stream(catalogue, cat.catalog_entry(manifest, lake.paths(tap_id, stream).stream_dir))
        if all((tap_id, stream) in settled for stream in streams):  # a failed stream's entry is unknown: keep the catalogue
            actions += _rewrite_if_changed(lake, catalogue_key(tap_id), catalogue, "catalogue", apply)
    if streams_of or RAW in lake.storage.list_dirs(""):  # a lake of pushed files alone has no singerlake.json
        root = lake.rebuild_root_metadata(keep=_current_root(lake))
        actions += _rewrite_if_changed(lake, ROOT_METADATA, root, "root", apply)
    actions += [Action(path, change) for path, change in repair_files(lake.storage, apply)]
    found.deliver(failures)
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
