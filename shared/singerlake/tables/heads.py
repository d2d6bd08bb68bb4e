"""Table heads (SPEC.md §12): where each stream's Delta table stood after the last project run that
committed it, one document per tap, so a run plans from the newest log entry without listing the log.

A hint, never trusted for safety: a commit of the next version is create-only, and a stream planned from
a stale head is planned again from the log. The heads also keep project's place in each tap's change log
(SPEC.md §16).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from singerlake.changes import Place
from singerlake.commits.commit import compare_and_swap
from singerlake.format.manifest import SPEC_VERSION
from singerlake.format.names import encode_segment
from singerlake.storage import Blob, NotFound, Storage, StorageError

log = logging.getLogger("singerlake.project")

FORMAT = "singerlake-heads"


def heads_key(tap_id: str) -> str:
    return f"published/{encode_segment(tap_id)}/heads.json"


@dataclass
class Heads:
    """A tap's heads as read: {stream: version}, and the document's bytes and ETag (None: there is none)."""

    tables: dict[str, int] = field(default_factory=dict)
    stored: Blob | None = None
    read: bool = True  # False: reading failed, the document's state is unknown
    changes: Place | None = None  # project's place in the tap's change log

    def get(self, stream: str) -> int | None:
        return self.tables.get(stream)


def read_heads(storage: Storage, tap_id: str) -> Heads:
    """The tap's heads; none when there is no document or it cannot be read (the logs are read instead)."""
    try:
        blob = storage.read(heads_key(tap_id))
    except NotFound:
        return Heads()
    except StorageError as exc:
        log.warning("%s: %s; the streams' tables are read from their logs", storage.url_of(heads_key(tap_id)), exc)
        return Heads(read=False)
    doc = _doc(blob.data)
    return Heads(_tables(doc), blob, changes=Place.from_doc(doc.get("changes")))


def raise_heads(storage: Storage, tap_id: str, versions: dict[str, int], known: Heads | None = None, place: Place | None = None) -> None:
    """Raise the heads of ``versions``' streams to those versions (a greater one found stays), and record
    ``place`` in the change log, starting from ``known`` as this run read it (one conditional write when
    nobody wrote since; none when nothing changes). A failure is a warning: the tables are committed, and
    the next run reads their logs (and the change log from the place it finds)."""
    if not versions and (place is None or (known is not None and known.changes == place)):
        return

    def change(current: bytes | None) -> bytes | None:
        found = _doc(current) if current else {}
        tables = _tables(found)
        merged = tables | {stream: max(version, tables.get(stream, -1)) for stream, version in versions.items()}
        changes = place.to_doc() if place is not None else found.get("changes")
        if merged == tables and current is not None and changes == found.get("changes"):
            return None
        doc = {"format": FORMAT, "spec_version": SPEC_VERSION, "tables": dict(sorted(merged.items()))}
        doc |= {"changes": changes} if changes is not None else {}
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()

    try:
        start = {"known": known.stored, "absent": known.stored is None} if known is not None and known.read else {}
        compare_and_swap(storage, heads_key(tap_id), change, durable=False, timeout_s=30.0, **start)
    except Exception as exc:  # a hint: never the run's failure
        log.warning("could not record the tables' heads in %s: %s", storage.url_of(heads_key(tap_id)), exc)


def _doc(data: bytes) -> dict:
    """The document; an unreadable one is empty (it is rewritten at the next commit)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else {}


def _tables(doc: dict) -> dict[str, int]:
    """The document's versions; an unreadable document names none."""
    tables = doc.get("tables")
    if not isinstance(tables, dict):
        return {}
    return {stream: version for stream, version in tables.items() if isinstance(version, int) and not isinstance(version, bool)}
