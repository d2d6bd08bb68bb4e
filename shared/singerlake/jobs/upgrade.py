"""``singerlake upgrade``: convert a lake's 1.x manifests to 2.0 in place (SPEC.md §13).

Each stream's 1.x ``manifest.json`` becomes a 2.0 root whose files are sealed into parts, by the
same compare-and-swap a commit uses (parts first, then the root, ``If-Match`` the 1.x version read):
a 1.x writer committing meanwhile only makes the swap retry on its newer manifest. Commit numbers,
generations and data files are unchanged, so bookmarks taken before the upgrade stay valid.

Entries written before 2.1 carry no column statistics (SPEC.md §5): upgrade lists them, and with
``apply`` finds them on Spark executors (one job for every stream) and adds them, as repair does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from singerlake.commits.commit import compare_and_swap, update_manifest
from singerlake.format import catalogue as cat
from singerlake.format.layout import ROOT_METADATA
from singerlake.format.manifest import MANIFEST_FORMAT_1, SPEC_VERSION, Manifest
from singerlake.format.parts import PartStore
from singerlake.lake import Lake
from singerlake.spark.runner import Failures, StreamFailure, by_stream, for_each_stream, run_stream_items
from singerlake.storage import NotFound
from singerlake.tables.statistics import add_statistics, missing_items, statistics_on_executor
from singerlake.text import counted


@dataclass(frozen=True)
class Upgrade:
    tap_id: str
    stream: str
    files: int  # of a 1.x manifest (0: the manifest is 2.0 already)
    parts: int
    statistics: int = 0  # entries without column statistics, given them when applied

    def __str__(self) -> str:
        changes = []
        if self.files:
            changes.append(f"1.x manifest of {counted(self.files, 'file')} -> 2.0 root with {counted(self.parts, 'part')}")
        if self.statistics:
            changes.append(f"column statistics for {self.statistics:,} file entries")
        return f"tap {self.tap_id!r}, stream {self.stream!r}: " + "; ".join(changes)

    def to_dict(self) -> dict:
        return asdict(self)


def upgrade_stream(lake: Lake, tap_id: str, stream: str, apply: bool) -> Upgrade | None:
    """The stream's upgrade (done when ``apply``), or None when its manifest is 2.0 already or missing."""
    paths = lake.paths(tap_id, stream)
    try:
        root = lake.storage.read(paths.manifest).data
    except NotFound:
        return None  # no manifest: readers scan, and the first writer or repair writes a 2.0 one
    manifest = Manifest.from_bytes(root, lake.storage.url_of(paths.manifest), PartStore(lake.storage, paths))
    missing = sum(1 for entry in manifest.files if "needs" not in entry)
    if manifest.read_format != MANIFEST_FORMAT_1:
        return Upgrade(tap_id, stream, 0, len(manifest.parts), missing) if missing else None
    files = len(manifest.tail)
    if apply:
        manifest = update_manifest(lake.storage, paths, lambda current: current.read_format == MANIFEST_FORMAT_1)
    else:
        manifest.seal()  # in memory only: how many parts it would become
    return Upgrade(tap_id, stream, files, len(manifest.parts), missing)


def _add_statistics(lake: Lake, spark: Any, upgrades: list[Upgrade], found: Failures) -> None:
    """Column statistics for every listed stream's entries without them: one Spark job, then a swap per stream."""
    plans = for_each_stream([(u.tap_id, u.stream) for u in upgrades], lambda tap, name: lake.manifest(tap, name), found)
    items = [item for (tap, name), manifest in plans.items() for item in missing_items(manifest, tap, name)]
    sizes = [item["entry"]["size"] for item in items]
    results = by_stream(items, run_stream_items(spark, items, functools.partial(statistics_on_executor, lake.storage), found, sizes=sizes))
    for (tap, name), done in results.items():
        for item, result in done:
            if "error" in result:
                found.add(tap, name, f"{item['entry']['path']}: no column statistics: {result['error']}")
    for_each_stream(list(results), lambda tap, name: add_statistics(lake, tap, name, results[(tap, name)], plans[(tap, name)]), found)


def upgrade(
    lake: Lake, apply: bool = False, failures: list[StreamFailure] | None = None, spark: Callable[[], Any] | None = None
) -> list[Upgrade]:
    """Every stream whose manifest is 1.x, converted when ``apply``; then ``singerlake.json`` says 2.0.
    Entries without column statistics are counted, and given them when ``apply`` and ``spark`` (a
    function starting Spark, called only when some entry lacks them)."""
    lake.check_exists()
    found = Failures()
    streams = [(tap, stream) for tap in lake.listed_taps() for stream in lake.listed_streams(tap)]
    done = for_each_stream(streams, lambda tap, stream: upgrade_stream(lake, tap, stream, apply), found)
    lacking = [u for u in done.values() if u is not None and u.statistics]
    if apply and spark is not None and lacking:
        _add_statistics(lake, spark(), lacking, found)
    if apply and lake.storage.exists(ROOT_METADATA):

        def to_current(current: bytes | None) -> bytes | None:
            if current is None:
                return None
            doc = cat.load(current, lake.storage.url_of(ROOT_METADATA), "root")
            return None if doc.get("spec_version") == SPEC_VERSION else cat.dump({**doc, "spec_version": SPEC_VERSION})

        compare_and_swap(lake.storage, ROOT_METADATA, to_current)
    found.deliver(failures)
    return [result for result in done.values() if result is not None]
