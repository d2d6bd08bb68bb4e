"""Lake layout: safe path segments for wild names, and the keys of every lake object.

Keys are relative to the lake root and always use ``/``. See SPEC.md §1-§2.
"""

from __future__ import annotations

import re
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from singerlake.errors import SingerlakeError
from singerlake.schema_hash import fingerprint_text

RAW = "raw"
ROOT_METADATA = f"{RAW}/singerlake.json"
CATALOGUE = "catalogue.json"
MANIFEST = "manifest.json"
PART_DIR = "_manifest"  # a stream's manifest parts; never a schema hash (those have no "_")
PART_SUFFIX = ".json.gz"
LOCK = "singerlake.lock"
NAME_FILE = "name.txt"
DATA_SUFFIX = ".singer.gz"

# Kept verbatim in a segment; everything else (including "." and upper case) is escaped.
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPE = "~"
MAX_SEGMENT_BYTES = 120
_TRUNCATED_MARK = "~~"
_ESCAPED = re.compile(r"~([0-9a-f]{2})")


class UnsafeName(SingerlakeError, ValueError):
    """A name that cannot be stored in the lake."""


def encode_segment(name: str) -> str:
    """Map a tap id or stream name to one path segment, reversibly and without collisions.

    Each UTF-8 byte outside ``[a-z0-9_-]`` becomes ``~`` plus two lower-case hex digits, so the
    result is case-insensitive-safe, has no ``.``/``/`` and so can never be ``.``/``..``/absolute.
    Segments longer than MAX_SEGMENT_BYTES are cut and suffixed with ``~~`` and a fingerprint of the
    full name; the full name is then kept in a ``name.txt`` beside the segment's contents.
    """
    if not isinstance(name, str) or name == "":
        raise UnsafeName(f"name must be a non-empty string, got {name!r}")
    out = []
    for ch in name:
        if ch in _PLAIN:
            out.append(ch)
        else:
            out.extend(f"{_ESCAPE}{byte:02x}" for byte in ch.encode("utf-8", "surrogatepass"))
    encoded = "".join(out)
    if len(encoded) <= MAX_SEGMENT_BYTES:
        return encoded
    head = encoded[: MAX_SEGMENT_BYTES - 16]
    # Never cut inside an escape: drop a dangling "~" or "~x".
    cut = head.rfind(_ESCAPE, len(head) - 2)
    if cut != -1:
        head = head[:cut]
    return f"{head}{_TRUNCATED_MARK}{fingerprint_text(name)}"


def is_truncated(segment: str) -> bool:
    return _TRUNCATED_MARK in segment


def decode_segment(segment: str) -> str:
    """Inverse of encode_segment for segments that were not truncated."""
    if is_truncated(segment):
        raise UnsafeName(f"segment {segment!r} is truncated; read its name.txt for the full name")
    if not segment or any(c not in _PLAIN and c != _ESCAPE for c in segment):
        raise UnsafeName(f"{segment!r} is not a Singerlake path segment")
    if _ESCAPED.sub("", segment).count(_ESCAPE):
        raise UnsafeName(f"{segment!r} has a malformed escape")
    raw = bytearray()
    i = 0
    while i < len(segment):
        if segment[i] == _ESCAPE:
            raw.append(int(segment[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.append(ord(segment[i]))
            i += 1
    return raw.decode("utf-8", "surrogatepass")


def check_key(key: str) -> str:
    """Reject keys that could leave the lake root (defence in depth below the encoders)."""
    parts = key.split("/")
    if not key or key.startswith("/") or "\\" in key or any(p in ("", ".", "..") for p in parts):
        raise UnsafeName(f"refusing unsafe lake key {key!r}")
    return key


def normalise_label(name: str) -> str:
    """The datalake record's ``where``/``what`` form: ``^[a-z0-9_-]+$``, at most 64 characters."""
    label = re.sub(r"[^a-z0-9_-]+", "_", name.lower()).strip("_")[:64]
    return label or f"n{fingerprint_text(name)}"


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def to_ms(dt: datetime) -> int:
    """Exact ms since the epoch (no float rounding)."""
    return (dt - EPOCH) // timedelta(milliseconds=1)


def now_ms() -> int:
    return to_ms(datetime.now(timezone.utc))


def format_ts(ms: int) -> str:
    """UTC, sortable, millisecond precision: ``20240101T000000.123Z``."""
    dt = EPOCH + timedelta(milliseconds=ms)
    return dt.strftime("%Y%m%dT%H%M%S.") + f"{dt.microsecond // 1000:03d}Z"


def iso_ms(ms: int) -> str:
    """ISO 8601 UTC with milliseconds, for human-facing timestamps in metadata."""
    dt = EPOCH + timedelta(milliseconds=ms)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def parse_ts(text: str) -> int:
    return to_ms(datetime.strptime(text, "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=timezone.utc))


_RANDOM_BITS = 74  # a UUIDv7's rand_a (12 bits) and rand_b (62 bits)
_last_id = (-1, 0)  # (ms, random part) of this process's previous id
_id_lock = threading.Lock()


def new_file_id(created_ms: int | None = None) -> str:
    """A UUIDv7 as 32 hex digits: unique, and ordered by creation time (rebuilds sort by it).

    Within one process, ids of the same millisecond keep their creation order too: the random part
    then counts up from the previous id's (RFC 9562 §6.2, method 2).
    """
    global _last_id
    ms = (now_ms() if created_ms is None else created_ms) & ((1 << 48) - 1)
    rand = uuid.uuid4().int & ((1 << _RANDOM_BITS) - 1)
    with _id_lock:
        last_ms, last_rand = _last_id
        if ms == last_ms and rand <= last_rand:
            rand = last_rand + 1 + (rand & 0xFFFF)
            if rand >> _RANDOM_BITS:  # practically never: borrow the next millisecond
                ms, rand = ms + 1, rand & ((1 << _RANDOM_BITS) - 1)
        _last_id = (ms, rand)
    value = ms << 80 | 0x7 << 76 | (rand >> 62) << 64 | 0x2 << 62 | (rand & ((1 << 62) - 1))
    return f"{value:032x}"


def file_id_ms(file_id: str) -> int:
    return int(file_id[:12], 16)


def tap_dir(tap_id: str) -> str:
    return f"{RAW}/{encode_segment(tap_id)}"


def catalogue_key(tap_id: str) -> str:
    return f"{tap_dir(tap_id)}/{CATALOGUE}"


@dataclass(frozen=True)
class StreamPaths:
    """Keys of one stream's objects, from its original tap id and stream name."""

    tap_id: str
    stream: str

    @property
    def tap_dir(self) -> str:
        return tap_dir(self.tap_id)

    @property
    def stream_dir(self) -> str:
        return f"{self.tap_dir}/{encode_segment(self.stream)}"

    @property
    def manifest(self) -> str:
        return f"{self.stream_dir}/{MANIFEST}"

    @property
    def catalogue(self) -> str:
        return catalogue_key(self.tap_id)

    def part(self, part_id: str) -> str:
        """An immutable manifest part (SPEC.md §5)."""
        return f"{self.stream_dir}/{PART_DIR}/{part_id}{PART_SUFFIX}"

    def schema_dir(self, schema_hash: str) -> str:
        return f"{self.stream_dir}/{schema_hash}"

    def lock(self, schema_hash: str) -> str:
        return f"{self.schema_dir(schema_hash)}/{LOCK}"

    def data_file(self, schema_hash: str, start_ms: int, end_ms: int, file_id: str) -> str:
        name = f"{encode_segment(self.stream)}-{format_ts(start_ms)}-{format_ts(end_ms)}-{file_id}"
        return check_key(f"{self.schema_dir(schema_hash)}/{name}{DATA_SUFFIX}")


@dataclass(frozen=True)
class DataFileName:
    """The parts of a data file key, parsed from the right (stream segments may contain ``-``)."""

    stream_segment: str
    schema_hash: str
    start_ms: int
    end_ms: int
    file_id: str

    @classmethod
    def parse(cls, key: str) -> DataFileName:
        parts = key.split("/")
        if len(parts) != 5 or parts[0] != RAW or not parts[4].endswith(DATA_SUFFIX):
            raise ValueError(f"{key!r} is not a data file key raw/<tap>/<stream>/<hash>/<name>{DATA_SUFFIX}")
        stem = parts[4][: -len(DATA_SUFFIX)]
        try:
            rest, file_id = stem.rsplit("-", 1)
            rest, end = rest.rsplit("-", 1)
            segment, start = rest.rsplit("-", 1)
            return cls(segment, parts[3], parse_ts(start), parse_ts(end), file_id)
        except ValueError as exc:
            raise ValueError(f"{key!r}: cannot parse <stream>-<first_ts>-<last_ts>-<id>: {exc}") from None
