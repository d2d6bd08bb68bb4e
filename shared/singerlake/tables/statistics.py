"""Column statistics for file entries written without them (SPEC.md §5; repair §12, upgrade §13).

Each entry lacking ``needs`` is one work item: its file is read (and checked against its hash) on
an executor, which returns the file's statistics; the driver then adds them to the stream's
manifest with one compare-and-swap (``Manifest.add_statistics``). A file that cannot be read keeps
its entry as it is and is reported.
"""

from __future__ import annotations

from singerlake.format.datafile import open_data_file
from singerlake.format.errors import CorruptFile
from singerlake.format.manifest import Manifest
from singerlake.format.needs import FileNeeds, properties_of
from singerlake.lake import Lake
from singerlake.storage import NotFound, Storage
from singerlake.times import iso_ms, now_ms


def missing_items(manifest: Manifest, tap_id: str, stream: str) -> list[dict]:
    """One item per file entry of the stream without ``needs``, tagged with its stream."""
    return [
        {"tap_id": tap_id, "stream": stream, "entry": e, "properties": properties_of(manifest.versions[e["schema_hash"]]["schema"])}
        for e in manifest.files
        if "needs" not in e
    ]


def statistics_on_executor(storage: Storage, item: dict) -> dict:
    """``{"fields": {"needs", "undeclared"?}}`` of the item's file, or ``{"error": ...}`` when it cannot be read."""
    needs = FileNeeds(item["properties"])
    try:
        with open_data_file(storage, item["entry"]) as unzipped:
            unzipped.readline()  # the SCHEMA line
            needs.add_file(unzipped)
    except (CorruptFile, NotFound, ValueError) as exc:
        return {"error": str(exc)}
    return {"fields": needs.fields()}


def add_statistics(lake: Lake, tap_id: str, stream: str, results: list[tuple[dict, dict]], planned: Manifest | None = None) -> int:
    """Add what the executors found (``(item, result)`` pairs) to the stream's manifest, in one
    compare-and-swap (a target committing meanwhile only makes it retry); returns the entries changed."""
    found = {item["entry"]["id"]: result["fields"] for item, result in results if "fields" in result}
    if not found:
        return 0
    changed = [0]

    def change(current: Manifest) -> bool:
        changed[0] = current.add_statistics(found, iso_ms(now_ms()))
        return changed[0] > 0

    lake.update_manifest(lake.paths(tap_id, stream), change, store=planned.store if planned else None)
    return changed[0]
