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
OPEN = ".open.json"  # an open marker's name ends so: a full visit lists which markers to read
MARGIN_MS = 10 * 60 * 1000  # a marker is listed within half of it; clocks agree within the other half
LEASE_MS = 60 * 60 * 1000  # an open marker covers its run's commits this long after its id's time
WALK_MS = 24 * 3600 * 1000  # a reader visits every stream at least this often
KEEP_MS = 2 * 24 * 3600 * 1000  # vacuum keeps markers this long at least: a reader's place is younger than a day


def log_prefix(tap_id: str) -> str:
    return f"changes/{encode_segment(tap_id)}/"


def write_marker(storage: Storage, tap_id: str, streams: set[str] | list[str], run: str | None = None, running: bool = False) -> str:
    """Name ``streams`` as committed (create-only, durable); returns the marker's key. ``running``: the
    open marker of ``run``, which may commit them again until it closes. A write that returned later
    than half the margin after its id's time is made again under a new id (SPEC.md §16)."""
    doc = {"format": FORMAT, "spec_version": SPEC_VERSION, "tap_id": tap_id}
    doc |= {"run": run} if run else {}
    doc |= {"running" if running else "streams": sorted(streams)}
    data = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    while True:
        marker_id = new_file_id()
        key = f"{log_prefix(tap_id)}{marker_id}{OPEN if running else '.json'}"
        storage.write(key, data, if_none_match=True, content_type="application/json")
        if now_ms() - file_id_ms(marker_id) <= MARGIN_MS // 2:
            return key
        log.warning("the change marker %s took over %d s to write: written again", storage.url_of(key), MARGIN_MS // 2000)


def old_markers(storage: Storage, tap_id: str, cutoff_ms: int) -> list[ObjectInfo]:
    """The tap's markers whose ids are older than ``cutoff_ms``."""
    prefix = log_prefix(tap_id)
    return [info for info in storage.list(prefix, start_after=None) if info.key[len(prefix) :] < _name_at(cutoff_ms)]


class Unmarked:
    """A landing run's markers: the streams committed since its last one, and those its open marker
    names; ``mark`` writes what is due (thread-safe, SPEC.md §16)."""

    def __init__(self, storage: Storage, tap_id: str):
        self.storage, self.tap_id = storage, tap_id
        self.run = new_file_id()
        self._streams: set[str] = set()  # committed since the last marker
        self._named: set[str] = set()  # every stream the run committed and named
        self._opened_ms: int | None = None  # when the open marker was written
        self._lock = threading.Lock()

    def add(self, stream: str) -> None:
        with self._lock:
            self._streams.add(stream)

    def mark(self, final: bool = False) -> None:
        """Before a STATE: an open marker when a stream is not named yet or the last one is half its lease
        old; ``final``: the closing marker naming every stream committed. On failure nothing is forgotten."""
        with self._lock:
            streams, named, opened = self._streams, self._named | self._streams, self._opened_ms
            self._streams = set()
            fresh = opened is not None and now_ms() - opened < LEASE_MS // 2
            try:
                if final and named and (streams or opened is not None):
                    write_marker(self.storage, self.tap_id, named, run=self.run)
                    self._opened_ms = None  # closed: a later commit opens again
                elif not final and streams and not (streams <= self._named and fresh):
                    started = now_ms()  # at most the marker id's time: its lease is renewed early, never late
                    write_marker(self.storage, self.tap_id, named, run=self.run, running=True)
                    self._opened_ms = started
            except BaseException:
                self._streams |= streams
                raise
            self._named = named


def options_digest(asked: object) -> str:
    """A digest of what a run was asked (formats, types, partitioning, deletes): a run asked otherwise visits every stream."""
    return hashlib.blake2b(json.dumps(asked, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


@dataclass
class Place:
    """How far a reader has read a tap's log: names up to ``after`` and those in ``seen``; when it last
    visited every stream; what it was asked; the streams to visit again (they failed); the runs still
    open, ``{run: {"streams": [...], "until": ms}}``."""

    after: str = ""
    seen: list[str] = field(default_factory=list)
    walked: int | None = None
    options: str = ""
    pending: list[str] = field(default_factory=list)
    open: dict[str, dict] = field(default_factory=dict)

    def to_doc(self) -> dict:
        return {
            "after": self.after,
            "seen": self.seen,
            "walked": self.walked,
            "options": self.options,
            "pending": self.pending,
            "open": self.open,
        }

    @classmethod
    def from_doc(cls, doc: object) -> Place | None:
        """The place a document holds; None when it holds none that can be trusted."""
        if not isinstance(doc, dict):
            return None
        after, seen, walked, options, pending = (doc.get(k) for k in ("after", "seen", "walked", "options", "pending"))
        runs = doc.get("open", {})
        if not (isinstance(after, str) and isinstance(options, str) and isinstance(walked, int) and not isinstance(walked, bool)):
            return None
        if not (isinstance(seen, list) and isinstance(pending, list) and all(isinstance(v, str) for v in [*seen, *pending])):
            return None
        if not (isinstance(runs, dict) and all(_run_entry(entry) for entry in runs.values())):
            return None
        return cls(after, seen, walked, options, pending, runs)


@dataclass
class Reading:
    """What a reader must visit (None: every stream) and where it stands once it has."""

    streams: set[str] | None
    place: Place


def read_changes(storage: Storage, tap_id: str, place: Place | None, options: str) -> Reading:
    """The streams named since ``place`` (one listing, one read per new marker) and those of runs still
    open, or None for all of them when the place is missing, older than a day, or was taken for other
    options (SPEC.md §16)."""
    now = now_ms()
    after = _name_at(now - MARGIN_MS)
    prefix = log_prefix(tap_id)
    if place is None or place.walked is None or now - place.walked > WALK_MS or place.options != options:
        return _walk(storage, tap_id, now, options)
    listed = [info.key[len(prefix) :] for info in storage.list(prefix, start_after=prefix + place.after if place.after else None)]
    runs = dict(place.open)
    streams = set(place.pending).union(*(entry["streams"] for entry in runs.values()))
    new = [name for name in listed if name not in place.seen]
    if not new and not _expired(runs, now):  # nothing new: the place stays (and is not written again)
        return Reading(streams, place)
    for name in new:
        try:
            streams |= _read_marker(storage, prefix + name, runs)
        except ValueError:
            return _walk(storage, tap_id, now, options)
    for run in _expired(runs, now):
        streams |= set(runs.pop(run)["streams"])  # visited once more, then no longer followed
    after = max(after, place.after)
    seen = sorted(name for name in {*place.seen, *listed} if name > after)
    return Reading(streams, Place(after, seen, place.walked, options, open=runs))


def _walk(storage: Storage, tap_id: str, now: int, options: str) -> Reading:
    """Every stream is visited: every marker listed is covered, but runs still open are followed (their
    open markers of the last lease are read)."""
    prefix = log_prefix(tap_id)
    after = _name_at(now - MARGIN_MS)
    listed = [info.key[len(prefix) :] for info in storage.list(prefix, start_after=prefix + _name_at(now - LEASE_MS - MARGIN_MS))]
    runs: dict[str, dict] = {}
    for name in listed:
        if name.endswith(OPEN) or name > after:
            try:
                _read_marker(storage, prefix + name, runs)
            except ValueError:
                pass  # every stream is visited anyway
    for run in _expired(runs, now):
        del runs[run]
    return Reading(None, Place(after, [name for name in listed if name > after], now, options, open=runs))


def _read_marker(storage: Storage, key: str, runs: dict[str, dict]) -> set[str]:
    """The streams a marker names, following its run in ``runs`` (opened, renewed or closed); raises
    ValueError (warned) for what is not a marker; a marker vacuumed meanwhile names nothing (older than
    any place needs)."""
    try:
        doc = json.loads(storage.read(key).data)
    except NotFound:
        return set()
    except ValueError:
        doc = None
    named = doc.get("running", doc.get("streams")) if isinstance(doc, dict) else None
    if not isinstance(named, list) or not all(isinstance(stream, str) for stream in named):
        log.warning("%s is not a change marker: every stream of its tap is visited", storage.url_of(key))
        raise ValueError(key)
    run = doc.get("run")
    if isinstance(run, str) and "running" in doc:
        until = file_id_ms(key.rsplit("/", 1)[-1]) + LEASE_MS
        runs[run] = {"streams": sorted(set(named) | set(runs.get(run, {}).get("streams", []))), "until": until}
    elif isinstance(run, str):
        named = [*named, *runs.pop(run, {}).get("streams", [])]
    return set(named)


def _expired(runs: dict[str, dict], now: int) -> list[str]:
    """Open runs whose lease (and the clocks' margin) has passed without a new open marker."""
    return [run for run, entry in runs.items() if entry["until"] + MARGIN_MS < now]


def _run_entry(entry: object) -> bool:
    if not isinstance(entry, dict) or not isinstance(entry.get("streams"), list) or not all(isinstance(v, str) for v in entry["streams"]):
        return False
    return isinstance(entry.get("until"), int) and not isinstance(entry["until"], bool)


def _name_at(ms: int) -> str:
    """Where a marker whose id has time ``ms`` sorts: below every id of that millisecond."""
    return f"{max(0, ms):012x}" + "0" * 20
