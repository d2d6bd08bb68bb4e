"""A tap's change log (SPEC.md §16): create-only markers naming the streams a landing committed, and a
reader's place in the log, so a job with nothing to do finds that out without visiting every stream.

A hint for speed, never for safety: a reader visits every stream when it has no place, once a day, and
when it is asked for something its last run was not.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass, field

from singerlake.format.manifest import SPEC_VERSION
from singerlake.format.names import encode_segment
from singerlake.storage import NotFound, ObjectInfo, Storage
from singerlake.times import file_id_ms, new_file_id, now_ms

log = logging.getLogger(__name__)

FORMAT = "singerlake-changes"
MARGIN_MS = 10 * 60 * 1000  # a marker is listed within half of it; clocks agree within the other half
WALK_MS = 24 * 3600 * 1000  # a reader visits every stream at least this often
KEEP_MS = 2 * 24 * 3600 * 1000  # vacuum keeps markers this long at least: a reader's place is younger than a day


def log_prefix(tap_id: str) -> str:
    return f"changes/{encode_segment(tap_id)}/"


def write_marker(storage: Storage, tap_id: str, streams: set[str] | list[str]) -> str:
    """Name ``streams`` as committed (create-only, durable); returns the marker's key. A write that
    returned later than half the margin after its id's time is made again under a new id (SPEC.md §16)."""
    doc = {"format": FORMAT, "spec_version": SPEC_VERSION, "tap_id": tap_id, "streams": sorted(streams)}
    data = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    while True:
        marker_id = new_file_id()
        key = f"{log_prefix(tap_id)}{marker_id}.json"
        storage.write(key, data, if_none_match=True, content_type="application/json")
        if now_ms() - file_id_ms(marker_id) <= MARGIN_MS // 2:
            return key
        log.warning("the change marker %s took over %d s to write: written again", storage.url_of(key), MARGIN_MS // 2000)


def old_markers(storage: Storage, tap_id: str, cutoff_ms: int) -> list[ObjectInfo]:
    """The tap's markers whose ids are older than ``cutoff_ms``."""
    prefix = log_prefix(tap_id)
    return [info for info in storage.list(prefix, start_after=None) if info.key[len(prefix) :] < _name_at(cutoff_ms)]


class Unmarked:
    """A landing run's streams committed since its last marker; ``mark`` names them (thread-safe)."""

    def __init__(self, storage: Storage, tap_id: str):
        self.storage, self.tap_id = storage, tap_id
        self._streams: set[str] = set()
        self._lock = threading.Lock()

    def add(self, stream: str) -> None:
        with self._lock:
            self._streams.add(stream)

    def mark(self) -> None:
        """One marker for the streams committed since the last one, if any; on failure they stay unmarked."""
        with self._lock:
            streams, self._streams = self._streams, set()
        try:
            if streams:
                write_marker(self.storage, self.tap_id, streams)
        except BaseException:
            with self._lock:
                self._streams |= streams
            raise


def options_digest(asked: object) -> str:
    """A digest of what a run was asked (formats, types, partitioning, deletes): a run asked otherwise visits every stream."""
    return hashlib.blake2b(json.dumps(asked, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


@dataclass
class Place:
    """How far a reader has read a tap's log: names up to ``after`` and those in ``seen``; when it last
    visited every stream; what it was asked; the streams to visit again (they failed)."""

    after: str = ""
    seen: list[str] = field(default_factory=list)
    walked: int | None = None
    options: str = ""
    pending: list[str] = field(default_factory=list)

    def to_doc(self) -> dict:
        return {"after": self.after, "seen": self.seen, "walked": self.walked, "options": self.options, "pending": self.pending}

    @classmethod
    def from_doc(cls, doc: object) -> Place | None:
        """The place a document holds; None when it holds none that can be trusted."""
        if not isinstance(doc, dict):
            return None
        after, seen, walked, options, pending = (doc.get(k) for k in ("after", "seen", "walked", "options", "pending"))
        if not (isinstance(after, str) and isinstance(options, str) and isinstance(walked, int) and not isinstance(walked, bool)):
            return None
        if not (isinstance(seen, list) and isinstance(pending, list) and all(isinstance(v, str) for v in [*seen, *pending])):
            return None
        return cls(after, seen, walked, options, pending)


@dataclass
class Reading:
    """What a reader must visit (None: every stream) and where it stands once it has."""

    streams: set[str] | None
    place: Place


def read_changes(storage: Storage, tap_id: str, place: Place | None, options: str) -> Reading:
    """The streams named since ``place`` (one listing, one read per new marker), or None for all of them
    when the place is missing, older than a day, or was taken for other options (SPEC.md §16)."""
    now = now_ms()
    after = _name_at(now - MARGIN_MS)
    prefix = log_prefix(tap_id)
    walk = place is None or place.walked is None or now - place.walked > WALK_MS or place.options != options
    start = after if walk else place.after
    listed = [info.key[len(prefix) :] for info in storage.list(prefix, start_after=prefix + start if start else None)]
    if walk:  # every stream is visited now: every marker listed is covered
        return Reading(None, Place(after, [name for name in listed if name > after], now, options))
    streams: set[str] = set(place.pending)
    if set(listed) <= set(place.seen):  # nothing new: the place stays (and is not written again)
        return Reading(streams, place)
    for name in listed:
        if name in place.seen:
            continue
        try:
            doc = json.loads(storage.read(prefix + name).data)
        except NotFound:  # vacuumed meanwhile: older than any place a visit needs it for
            continue
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("streams"), list):
            log.warning("%s is not a change marker: every stream of %s is visited", storage.url_of(prefix + name), tap_id)
            return Reading(None, Place(after, [n for n in listed if n > after], now, options))
        streams.update(stream for stream in doc["streams"] if isinstance(stream, str))
    after = max(after, place.after)
    seen = sorted(name for name in {*place.seen, *listed} if name > after)
    return Reading(streams, Place(after, seen, place.walked, options))


def _name_at(ms: int) -> str:
    """Where a marker whose id has time ``ms`` sorts: below every id of that millisecond."""
    return f"{max(0, ms):012x}" + "0" * 20
