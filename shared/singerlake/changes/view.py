"""Views derived from a tap's change log (SPEC.md §16): what a reading job (``ls``, ``docs``) computed per
stream on its last run, kept with its place in the log and the table head (``published/<tap>/heads.json``)
each stream had then, so its next run computes again only the streams the log names since, those whose
table moved (project writes no marker: the heads tell) and those that failed.

Derived data, trusted for speed only: a view that cannot be read (missing, damaged, of another format
version, lake, tap or job) means visiting every stream, as do the change log's own rules (no place, a
place older than a day, other options); a view that cannot be written is a warning, never an error.
``ls`` keeps its views on this machine (it may run with read-only credentials), ``docs`` beside its site.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field

from singerlake.changes import Place, read_changes
from singerlake.format.names import encode_segment
from singerlake.storage import LocalStorage, NotFound, Storage
from singerlake.storage.proven import cache_dir

log = logging.getLogger(__name__)

FORMAT = "singerlake-view"
VERSION = 1  # another version is not read: the run visits every stream and writes this one
VIEW_DIR = "_singerlake/"  # beside a site's pages


@dataclass
class Entry:
    """One stream in a view: what the job computed, the table head it computed it at, and whether it failed."""

    doc: dict
    head: int | None = None
    failed: bool = False  # visited again next run, whatever the log says


@dataclass
class View:
    place: Place
    streams: dict[str, Entry] = field(default_factory=dict)


@dataclass
class Visit:
    """The streams a run computes (None: every stream of the tap) and its place in the log once it has."""

    streams: set[str] | None
    place: Place


def to_visit(storage: Storage, tap_id: str, view: View | None, heads: dict[str, int] | None, options: str = "") -> Visit:
    """What a run of a tap with ``view`` (None: none could be read) computes: the streams the change log names
    since the view's place, those whose head in ``heads`` (None: unreadable) differs from the view's, and those
    that failed; every stream when there is no view or the log says so."""
    reading = read_changes(storage, tap_id, view.place if view is not None else None, options)
    if view is None or reading.streams is None or heads is None:
        return Visit(None, reading.place)
    again = {name for name, entry in view.streams.items() if entry.failed or entry.head != heads.get(name)}
    return Visit(reading.streams | again, reading.place)


def updated(view: View | None, visit: Visit, computed: dict[str, Entry]) -> View:
    """The view after a run: the computed streams, and the kept ones unless the run visited every stream."""
    kept = view.streams if view is not None and visit.streams is not None else {}
    return View(visit.place, dict(sorted((kept | computed).items())))


# -- stored ----------------------------------------------------------------------------------------------
def view_key(prefix: str, tap_id: str) -> str:
    """``<prefix>_singerlake/view-<tap>.json``: an encoded segment has no ``/`` or ``.``, so it stays in the folder."""
    return f"{prefix}{VIEW_DIR}view-{encode_segment(tap_id)}.json"


def local_views(lake: Storage) -> LocalStorage:
    """This machine's views of ``lake`` (``ls``): under the cache folder, in a folder named by a digest of what reaches the lake."""
    reach = json.dumps([lake.url, lake.open_options().get("endpoint_url")])
    return LocalStorage(cache_dir() / "views" / hashlib.sha256(reach.encode()).hexdigest()[:32])


def read_view(storage: Storage, key: str, job: str, lake_url: str, tap_id: str) -> View | None:
    """The view at ``key``, or None when there is none that can be trusted (the run visits every stream)."""
    try:
        doc = json.loads(storage.read(key).data)
    except NotFound:
        return None
    except Exception as exc:  # damaged, unreadable: derived data, rebuilt by this run
        log.info("%s cannot be read (%s): every stream of %s is visited", storage.url_of(key), exc, tap_id)
        return None
    if not isinstance(doc, dict) or [doc.get(k) for k in ("format", "version", "job", "lake", "tap_id")] != [
        FORMAT,
        VERSION,
        job,
        lake_url,
        tap_id,
    ]:
        return None
    place, streams = Place.from_doc(doc.get("place")), doc.get("streams")
    if place is None or not isinstance(streams, dict):
        return None
    entries = {}
    for name, entry in streams.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("doc"), dict) and isinstance(entry.get("head"), int | None)):
            return None
        entries[name] = Entry(entry["doc"], entry["head"], entry.get("failed") is True)
    return View(place, entries)


def write_view(storage: Storage, key: str, view: View, job: str, lake_url: str, tap_id: str) -> None:
    """Store ``view``; a failure is one warning line (the next run visits every stream)."""
    doc = {"format": FORMAT, "version": VERSION, "job": job, "lake": lake_url, "tap_id": tap_id, "place": view.place.to_doc()}
    doc["streams"] = {name: {"doc": e.doc, "head": e.head} | ({"failed": True} if e.failed else {}) for name, e in view.streams.items()}
    data = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    try:
        storage.write(key, data, durable=False, content_type="application/json")
    except Exception as exc:
        log.warning("could not keep the %s view of %s in %s: %s; the next run visits every stream", job, tap_id, storage.url_of(key), exc)
