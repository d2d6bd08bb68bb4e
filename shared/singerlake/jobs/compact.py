"""``singerlake compact``: merge many small files of a stream-schema into few large ones (SPEC.md §12).

Groups are runs of files adjacent in replay order, of one schema version, with no
ACTIVATE_VERSION between them, so replay order is unchanged. Each group is merged on an executor
(records concatenated in order, each source verified against its blake2 hash first) into one new
file carrying its records' positions (``runs``, SPEC.md §11), so readers' bookmarks stay exact.
The groups of all selected streams are merged in one Spark job; then all groups of a stream are
swapped in by one manifest compare-and-swap; a target committing at the same time only makes the
swap retry on the new manifest. The parts holding replaced files are superseded, not deleted: they
and the replaced files stay on storage until vacuum, so readers holding the old root keep working.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from singerlake.commits.errors import CommitRejected
from singerlake.format.datafile import member_compressor, open_data_file, store
from singerlake.format.layout import StreamPaths
from singerlake.format.manifest import Manifest
from singerlake.format.needs import FileNeeds, properties_of
from singerlake.format.positions import Run, entry_runs
from singerlake.lake import Lake
from singerlake.pause import pause_point
from singerlake.spark.runner import (
    Failures,
    Progress,
    StreamFailure,
    by_stream,
    for_each_stream,
    run_stream_items,
    selected_streams,
)
from singerlake.storage import Storage
from singerlake.text import counted
from singerlake.times import iso_ms, new_file_id, now_ms

DEFAULT_TARGET_BYTES = 128 << 20
SWAP_THREADS = 4  # manifest swaps at once: each is its own compare-and-swap, retried on conflict


@dataclass(frozen=True)
class Compaction:
    tap_id: str
    stream: str
    files_before: int
    files_after: int
    groups: int
    bytes_merged: int

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def plan_groups(manifest: Manifest, target_bytes: int) -> list[list[tuple[dict, list[Run]]]]:
    """Runs of at least two small files that may become one file each."""
    activated_after = {a["after_commit"] for a in manifest.activate_versions}
    groups, current, size = [], [], 0

    def close() -> None:
        if len(current) >= 2:
            groups.append(list(current))

    for entry, runs in entry_runs(manifest.files):
        if current:
            previous_end = current[-1][1][-1].commit
            activation_between = any(previous_end <= k < runs[0].commit for k in activated_after)
            if entry["schema_hash"] != current[-1][0]["schema_hash"] or activation_between or size + entry["size"] > target_bytes:
                close()
                current, size = [], 0
        if entry["size"] >= target_bytes:
            continue  # already large: left as it is
        current.append((entry, runs))
        size += entry["size"]
    close()
    return groups


def merged_runs(group: list[tuple[dict, list[Run]]]) -> list[dict]:
    runs: list[dict] = []
    for _, file_runs_ in group:
        for run in file_runs_:
            last = runs[-1] if runs else None
            if last and last["commit"] == run.commit and last["first"] + last["records"] == run.first:
                last["records"] += run.records
            else:
                runs.append({"commit": run.commit, "first": run.first, "records": run.records})
    return runs


def merge_group(storage: Storage, compresslevel: int, item: dict) -> dict:
    """Executor side: write the group's records, in order, as one new data file; return its entry."""
    paths = StreamPaths(item["tap_id"], item["stream"])
    compressor = member_compressor(compresslevel)
    needs = FileNeeds(item["properties"])  # the join of the sources' statistics (SPEC.md §5)
    parts, schema_line = [], None
    for entry in item["files"]:
        if "needs" in entry:
            needs.add_entry(entry)
        with open_data_file(storage, entry) as unzipped:
            first = unzipped.readline()
            if schema_line is None:
                schema_line = first
                parts.append(compressor.compress(first))
            for block in needs.blocks(unzipped, read="needs" not in entry):  # a source without statistics: read for them
                parts.append(compressor.compress(block))
    parts.append(compressor.flush())
    data = b"".join(parts)
    start, end = min(e["start"] for e in item["files"]), max(e["end"] for e in item["files"])
    records = sum(e["records"] for e in item["files"])
    record = store(storage, paths, item["schema_hash"], data, start, end, records, item["work_id"])
    return {**record, "runs": item["runs"], **needs.fields()}


def plan_stream(lake: Lake, tap_id: str, stream: str, target_bytes: int, work_id: str) -> tuple[Manifest, list[dict]]:
    """The stream's manifest and one merge item per group (tagged with the stream)."""
    manifest = lake.manifest(tap_id, stream)
    items = [
        {
            "tap_id": tap_id,
            "stream": stream,
            "schema_hash": g[0][0]["schema_hash"],
            "properties": properties_of(manifest.versions[g[0][0]["schema_hash"]]["schema"]),
            "files": [e for e, _ in g],
            "runs": merged_runs(g),
            "work_id": work_id,
        }
        for g in plan_groups(manifest, target_bytes)
    ]
    return manifest, items


def swap_in(lake: Lake, tap_id: str, stream: str, merged: list[tuple[dict, dict]], planned: Manifest | None = None) -> Manifest:
    """One compare-and-swap puts the stream's merged files in place of their groups (new parts in place
    of the parts holding them, SPEC.md §12). ``planned``: the manifest planned from, whose parts are read already."""
    swaps = [([e["id"] for e in item["files"]], new) for item, new in merged]
    vacuumed: list[str] = []

    def swap(current: Manifest) -> bool:
        present = current.file_ids()
        # A merged file at or below the horizon may be gone: vacuum took it for an orphan (SPEC.md §15).
        vacuumed[:] = current.below_horizon(new["id"] for _, new in swaps)
        valid = [(ids, new) for ids, new in swaps if set(ids) <= present and new["id"] not in vacuumed]  # another compaction may have won
        if not valid:
            return False
        current.replace_files(valid, iso_ms(now_ms()))
        return True

    manifest = lake.update_manifest(lake.paths(tap_id, stream), swap, store=planned.store if planned else None)
    if vacuumed:
        raise CommitRejected(
            f"{counted(len(vacuumed), 'merged file')} deleted by a vacuum before being swapped in; their sources stay, compact again"
        )
    return manifest


def compact(
    lake: Lake,
    spark,
    tap_id: str | None = None,
    stream: str | None = None,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    compresslevel: int = 6,
    progress: Progress | None = None,
    before_commit: Callable[[], None] | None = None,
    failures: list[StreamFailure] | None = None,
) -> list[Compaction]:
    """Compact the selected streams: every group of every stream is merged in one Spark job, then
    each stream's merged files are swapped in by its own compare-and-swap (a few streams at a time).

    A stream that fails (unreadable manifest, a source failing its hash check, a lost swap) is added
    to ``failures`` and the others are compacted; the groups of a failing stream that did merge are
    still swapped in. Without ``failures``, StreamsFailed is raised at the end.
    """
    lake.check_exists()
    found = Failures()
    work_id = f"compact-{new_file_id()[:16]}"
    plans = for_each_stream(
        selected_streams(lake, tap_id, stream), lambda tap, name: plan_stream(lake, tap, name, target_bytes, work_id), found
    )
    items = [item for _, stream_items in plans.values() for item in stream_items]
    sizes = [sum(e["size"] for e in item["files"]) for item in items]
    work = functools.partial(merge_group, lake.storage, compresslevel)
    merged = by_stream(items, run_stream_items(spark, items, work, found, progress, sizes=sizes))
    if before_commit:
        before_commit()  # tests: a concurrent commit lands here
    pause_point("compact-before-swap")

    def finish(tap: str, name: str) -> Compaction:
        manifest, done = plans[(tap, name)][0], merged.get((tap, name), [])
        files_after = swap_in(lake, tap, name, done, manifest).file_count() if done else manifest.file_count()
        bytes_merged = sum(e["size"] for item, _ in done for e in item["files"])
        return Compaction(tap, name, manifest.file_count(), files_after, len(done), bytes_merged)

    results = for_each_stream(list(plans), finish, found, threads=SWAP_THREADS)
    found.deliver(failures)
    return list(results.values())


def compact_stream(lake: Lake, spark, tap_id: str, stream: str, **options) -> Compaction:
    """Compact one stream; raises StreamsFailed when it fails."""
    return compact(lake, spark, tap_id, stream, **options)[0]
