"""A data file's column statistics (SPEC.md §5): what its values need to be typed, kept in its entry.

``FileNeeds`` gathers them where a file's records pass anyway (landing, compaction, repair);
``entry_fields`` gives the entry's ``needs`` and ``undeclared`` fields, compact: properties whose
need is null or their kind's plain need (``PLAIN``) are left out. ``needs_under`` reads them back
under the schema a reader reads (a version's, or the merged replay schema), or says they cannot
tell (the reader then reads that file's values, as ``exact`` always did).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from decimal import Decimal
from typing import Any, BinaryIO

import msgspec
from isal import isal_zlib

from singerlake.format.bulk_needs import BlockNeeds
from singerlake.format.exact import Need, declared, decode, join_all, records_needs
from singerlake.format.messages import message_record

BLOCK_BYTES = 1 << 20  # a data file is read for its statistics a block of lines at a time
PLAIN = {"integer": "long", "bool": "bool", "string": "string", "timestamp": "timestamp", "date": "date"}


class _Message(msgspec.Struct, gc=False):
    record: Any = None  # the rest of the envelope is skipped by the decoder


_messages = msgspec.json.Decoder(list[_Message], float_hook=Decimal)  # numbers exact, as ``exact.decode``


def properties_of(schema: Any) -> dict[str, Any]:
    """A JSON schema's ``properties`` (those of a file's version, or of the schema read); {} when it has none."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return properties if isinstance(properties, dict) else {}


def plain(schema: dict) -> Need:
    """The need a property left out of ``needs`` stands for (null and it are the same to every type)."""
    return PLAIN.get(declared(schema))


def shape(schema: Any) -> Any:
    """All a value's need depends on: the declared kind, and for structs and lists their parts' shapes."""
    kind = declared(schema)
    if kind == "struct":
        return {"struct": {name: shape(spec) for name, spec in schema["properties"].items()}}
    if kind == "list":
        return {"list": shape(schema["items"])}
    return kind


def records_of(lines: bytes) -> list[dict]:
    """The ``record`` of each RECORD line in ``lines`` (newline-terminated), decoded with exact numbers;
    one decoder call for all of them (a line only json accepts, e.g. ``NaN``, is decoded on its own)."""
    text = lines.rstrip(b"\r\n")
    if not text:
        return []
    try:
        messages = [message.record for message in _messages.decode(b"[" + text.replace(b"\n", b",") + b"]")]
    except msgspec.DecodeError:
        messages = [message_record(decode(line)) for line in text.split(b"\n") if line.strip()]
    return [record if isinstance(record, dict) else {} for record in messages]


class FileNeeds:
    """The needs of one file's records under its schema's ``properties``, added chunk by chunk."""

    def __init__(self, properties: dict[str, dict]):
        self.properties = properties
        self.needs: dict[str, Need] = {}
        self.undeclared: set[str] = set()
        self._bulk = BlockNeeds(properties)

    def add_records(self, records: list[dict]) -> None:
        self.needs = join_all([self.needs, records_needs(self.properties, records)])
        for record in records:
            if not record.keys() <= self.properties.keys():
                self.undeclared |= record.keys() - self.properties.keys()

    def add_lines(self, lines: bytes, count: int | None = None) -> None:
        """Newline-terminated RECORD lines (``count`` of them, when known): in bulk (``bulk_needs``), or
        record by record when that cannot tell."""
        found = self._bulk.block_needs(lines, count)
        if found is None:
            self.add_records(records_of(lines))
        else:
            self.needs = join_all([self.needs, found[0]])
            self.undeclared |= found[1]

    def add_entry(self, entry: dict) -> None:
        """Join a file's stored statistics (it must have ``needs``): compaction's merged files need the join of their sources'."""
        self.needs = join_all([self.needs, stored_needs(entry, self.properties)])
        self.undeclared |= set(entry.get("undeclared", ()))

    def blocks(self, unzipped: BinaryIO, read: bool = True) -> Iterator[bytes]:
        """The rest of an unzipped data file in blocks of whole lines; with ``read``, their records' needs are added on the way."""
        while block := unzipped.read(BLOCK_BYTES):
            block += unzipped.readline()
            if read:
                self.add_lines(block)
            yield block

    def add_file(self, unzipped: BinaryIO) -> None:
        """The needs of the records of an unzipped data file read after its SCHEMA line."""
        for _ in self.blocks(unzipped):
            pass

    def add_member(self, member: bytes | memoryview, count: int | None = None) -> None:
        """A gzip member of RECORD lines (SPEC.md §4; ``count`` of them, when known), as landing writes them."""
        self.add_lines(isal_zlib.decompress(member, wbits=16 + zlib.MAX_WBITS), count)

    def fields(self) -> dict[str, Any]:
        return entry_fields(self.properties, self.needs, self.undeclared)


def entry_fields(properties: dict[str, dict], needs: dict[str, Need], undeclared: set[str] | list[str] = ()) -> dict[str, Any]:
    """The entry's ``needs`` (only what is neither null nor plain) and, when some record has keys
    outside ``properties``, ``undeclared``."""
    kept = {name: need for name, need in needs.items() if need is not None and need != plain(properties.get(name, {}))}
    return {"needs": kept, **({"undeclared": sorted(undeclared)} if undeclared else {})}


def stored_needs(entry: dict, properties: dict[str, dict]) -> dict[str, Need] | None:
    """The entry's needs of every property of its own schema, plain needs filled in; None without ``needs``."""
    if "needs" not in entry:
        return None
    stored = entry["needs"]
    return {name: stored[name] if name in stored else plain(spec) for name, spec in properties.items()}


class StatsReader:
    """The needs of planned files, read from their entries' statistics under the properties ``read``
    (the schema being read, SPEC.md §5), ``versions`` being the manifest's (each file's own schema)."""

    def __init__(self, versions: dict[str, dict], read: dict[str, Any]):
        self.versions, self.read = versions, read
        self._plans: dict[str, tuple[dict[str, Need], frozenset[str]] | None] = {}
        self._seen: dict[tuple, dict[str, Need] | None] = {}  # most files of a stream store the same statistics

    def _plan(self, schema_hash: str) -> tuple[dict[str, Need], frozenset[str]] | None:
        """For files of version ``schema_hash``: the plain need of each property read that it declares,
        and the properties read it does not declare; None when one declared property differs in shape."""
        if schema_hash not in self._plans:
            own = properties_of(self.versions[schema_hash]["schema"])
            shared = [name for name in self.read if name in own]
            same = all(shape(own[name]) == shape(self.read[name]) for name in shared)
            plan = ({name: plain(own[name]) for name in shared}, frozenset(self.read.keys() - own.keys()))
            self._plans[schema_hash] = plan if same else None
        return self._plans[schema_hash]

    def needs(self, entry: dict) -> dict[str, Need] | None:
        """The file's needs of every property read; None when its statistics cannot tell (no ``needs``,
        a property of another shape, an undeclared key the read schema declares): read the file."""
        if "needs" not in entry:
            return None
        key = (entry["schema_hash"], msgspec.json.encode(entry["needs"]), tuple(entry.get("undeclared", ())))
        if key not in self._seen:
            self._seen[key] = self._needs(entry)
        return self._seen[key]

    def _needs(self, entry: dict) -> dict[str, Need] | None:
        plan = self._plan(entry["schema_hash"])
        if plan is None or not plan[1].isdisjoint(entry.get("undeclared", ())):
            return None
        stored = entry["needs"]
        return {name: stored.get(name, need) for name, need in plan[0].items()}

    def split(self, files: list[dict]) -> tuple[dict[str, Need], list[dict]]:
        """The join of what the statistics of planned files (``{"entry": ...}``) say, and the files they cannot speak for."""
        known: dict[int, dict[str, Need]] = {}  # files with the same statistics share one dict (``needs``)
        unread = []
        for file in files:
            needs = self.needs(file["entry"])
            if needs is None:
                unread.append(file)
            else:
                known[id(needs)] = needs
        return join_all(list(known.values())), unread
