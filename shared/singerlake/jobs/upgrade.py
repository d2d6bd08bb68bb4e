"""``singerlake upgrade``: convert a lake's 1.x manifests to 2.0 in place (SPEC.md §13).

Each stream's 1.x ``manifest.json`` becomes a 2.0 root whose files are sealed into parts, by the
same compare-and-swap a commit uses (parts first, then the root, ``If-Match`` the 1.x version read):
a 1.x writer committing meanwhile only makes the swap retry on its newer manifest. Commit numbers,
generations and data files are unchanged, so bookmarks taken before the upgrade stay valid.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from singerlake.commits.commit import compare_and_swap, update_manifest
from singerlake.format import catalogue as cat
from singerlake.format.layout import ROOT_METADATA
from singerlake.format.manifest import MANIFEST_FORMAT_1, SPEC_VERSION, Manifest
from singerlake.format.parts import PartStore
from singerlake.jobs.runner import Failures, StreamFailure, for_each_stream
from singerlake.lake import Lake
from singerlake.storage import NotFound


@dataclass(frozen=True)
class Upgrade:
    tap_id: str
    stream: str
    files: int
    parts: int

    def __str__(self) -> str:
        return f"tap {self.tap_id!r}, stream {self.stream!r}: 1.x manifest of {self.files:,} files -> 2.0 root with {self.parts} part(s)"

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
    if manifest.read_format != MANIFEST_FORMAT_1:
        return None
    files = len(manifest.tail)
    if apply:
        manifest = update_manifest(lake.storage, paths, lambda current: current.read_format == MANIFEST_FORMAT_1)
    else:
        manifest.seal()  # in memory only: how many parts it would become
    return Upgrade(tap_id, stream, files, len(manifest.parts))


def upgrade(lake: Lake, apply: bool = False, failures: list[StreamFailure] | None = None) -> list[Upgrade]:
    """Every stream whose manifest is 1.x, converted when ``apply``; then ``singerlake.json`` says 2.0."""
    lake.check_exists()
    found = Failures()
    streams = [(tap, stream) for tap in lake.listed_taps() for stream in lake.listed_streams(tap)]
    done = for_each_stream(streams, lambda tap, stream: upgrade_stream(lake, tap, stream, apply), found)
    if apply and lake.storage.exists(ROOT_METADATA):

        def to_current(current: bytes | None) -> bytes | None:
            if current is None:
                return None
            doc = cat.load(current, lake.storage.url_of(ROOT_METADATA), "root")
            return None if doc.get("spec_version") == SPEC_VERSION else cat.dump({**doc, "spec_version": SPEC_VERSION})

        compare_and_swap(lake.storage, ROOT_METADATA, to_current)
    found.deliver(failures)
    return [result for result in done.values() if result is not None]
