"""Replaying a stream exactly: files in commit order, from a bookmark, inside a time window (SPEC.md §11).

Every record has a **position**: the commit that first made it visible and its index among that
commit's records. A bookmark is the position reached, so it names records, not files: a later
compaction that rewrites files (keeping each record's position in ``runs``) cannot make a reader
replay what it already emitted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from singerlake.format.datafile import open_data_file
from singerlake.format.errors import BadInput, CorruptFile
from singerlake.format.manifest import Manifest
from singerlake.format.messages import TimeParser, decode_envelope, sdc_extracted_at
from singerlake.format.positions import Position, already_replayed, check_bookmark, end_of, entry_runs
from singerlake.storage import Storage
from singerlake.times import record_time_ms

CHUNK = 1 << 20

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Window:
    """Record times ``start_ms <= t < end_ms``; either bound may be open (None)."""

    start_ms: int | None = None
    end_ms: int | None = None

    def covers_all(self, entry: dict) -> bool:
        return (self.start_ms is None or entry["start"] >= self.start_ms) and (self.end_ms is None or entry["end"] < self.end_ms)

    def misses(self, entry: dict) -> bool:
        return (self.start_ms is not None and entry["end"] < self.start_ms) or (self.end_ms is not None and entry["start"] >= self.end_ms)

    def contains(self, ms: int) -> bool:
        return (self.start_ms is None or ms >= self.start_ms) and (self.end_ms is None or ms < self.end_ms)


# -- what a replay yields ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Schema:
    """The schema version of the records that follow: the file's stored SCHEMA line and its parts."""

    schema_hash: str
    line: bytes
    schema: dict
    key_properties: list[str]


@dataclass(frozen=True)
class Lines:
    """Whole RECORD lines, byte for byte as stored, each ending in ``\\n``."""

    data: bytes


@dataclass(frozen=True)
class Activate:
    version: int


@dataclass(frozen=True)
class Reached:
    """Everything up to ``position`` has been yielded: a safe bookmark."""

    position: Position


# -- reading files ----------------------------------------------------------------------------------
def record_time(line: bytes, parse: TimeParser) -> int | None:
    """A stored record's time (SPEC.md §1), or None when the message carries none of its own."""
    envelope = decode_envelope(line, 0)
    return record_time_ms(envelope.time_extracted, lambda: sdc_extracted_at(envelope.record), parse=parse)


class StreamReplay:
    """The events replaying one stream after ``after`` inside ``window``."""

    def __init__(
        self,
        storage: Storage,
        manifest: Manifest,
        after: Position | None = None,
        window: Window | None = None,
        skip_corrupt: bool = False,
    ):
        self.storage = storage
        self.manifest = manifest
        self.after = after
        self.window = window or Window()
        self.skip_corrupt = skip_corrupt
        self.files_opened: list[str] = []
        self.files_skipped: list[str] = []
        self.parts_opened = 0
        self._times = TimeParser()
        check_bookmark(after, manifest)

    def events(self) -> Iterator[Schema | Lines | Activate | Reached]:
        # Only the parts holding commits from the bookmark on, and inside the window, are opened.
        plan = self.manifest.plan(self.after.commit if self.after else None, self.window)
        self.parts_opened = plan.parts_opened
        self._pending = sorted(plan.activations, key=lambda a: a["after_commit"])
        generation = self.manifest.generation
        start = self.after or Position(0, 0)
        self._position = Position(start.commit, start.records, generation)
        current_hash = None
        for entry, runs in entry_runs(plan.files):
            yield from self._activations(before_commit=runs[0].commit)
            skip = already_replayed(runs, self.after)
            self._position = max(self._position, end_of(runs, generation))
            if skip >= entry["records"] or self.window.misses(entry):
                continue  # nothing new, or outside the window: never opened
            try:
                for event in self._read_file(entry, skip):
                    if isinstance(event, Schema):
                        if event.schema_hash == current_hash:
                            continue
                        current_hash = event.schema_hash
                    yield event
            except CorruptFile as exc:
                if not self.skip_corrupt:
                    raise
                log.warning("skipping a corrupt file; its records are not replayed: %s", exc)
                self.files_skipped.append(entry["path"])
            yield Reached(self._position)
        yield from self._activations(before_commit=None)
        self._position = max(self._position, Position(*plan.passed, generation))  # parts the window skipped
        yield Reached(self._position)  # also covers files passed at the end without opening them

    def _activations(self, before_commit: int | None) -> Iterator[Activate | Reached]:
        """ACTIVATE_VERSION messages placed before ``before_commit`` (all when None), unless replayed already."""
        while self._pending and (before_commit is None or self._pending[0]["after_commit"] < before_commit):
            activation = self._pending.pop(0)
            place = Position(activation["after_commit"], activation["records"], self.manifest.generation)
            if self.after is None or self.after < place:
                yield Activate(activation["version"])
                self._position = max(self._position, place)
                yield Reached(self._position)

    def _read_file(self, entry: dict, skip: int) -> Iterator[Schema | Lines]:
        name = self.storage.url_of(entry["path"])
        self.files_opened.append(entry["path"])
        with open_data_file(self.storage, entry) as unzipped:
            schema_line = unzipped.readline()
            yield self._schema(entry, schema_line, name)
            if skip == 0 and self.window.covers_all(entry):
                yield from _blocks(unzipped)
            else:
                yield from self._filtered(unzipped, skip, entry, name)

    def _filtered(self, unzipped: BinaryIO, skip: int, entry: dict, name: str) -> Iterator[Lines]:
        """A file only partly wanted: the first ``skip`` records are replayed already; some may lie outside the window."""
        by_time = not self.window.covers_all(entry)
        for index, line in enumerate(unzipped):
            if index < skip:
                continue
            if by_time:
                try:
                    ms = record_time(line, self._times)
                except BadInput as exc:
                    raise CorruptFile(f"{name}: record {index + 1}: {exc}") from None
                if ms is not None and not self.window.contains(ms):
                    continue  # a record without a time of its own belongs to its file's span: kept
            yield Lines(line)

    def _schema(self, entry: dict, line: bytes, name: str) -> Schema:
        try:
            is_schema = decode_envelope(line, 1).type == "SCHEMA"
        except BadInput:
            is_schema = False
        if not is_schema:
            raise CorruptFile(f"{name}: the first line is not a SCHEMA message")
        version = self.manifest.versions[entry["schema_hash"]]
        return Schema(entry["schema_hash"], line, version["schema"], version["key_properties"])


def _blocks(unzipped: BinaryIO) -> Iterator[Lines]:
    """Whole lines in ~1 MiB blocks: one write per block instead of one per record."""
    carry = b""
    while chunk := unzipped.read(CHUNK):
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:
            carry += chunk
            continue
        yield Lines(carry + chunk[:cut])
        carry = chunk[cut:]
    if carry:
        yield Lines(carry + b"\n")  # data files end every line with \n (SPEC.md §4); be lenient on read
