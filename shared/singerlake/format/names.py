"""Names: wild tap ids and stream names as safe, reversible path segments (SPEC.md §2)."""

from __future__ import annotations

import re

from singerlake.errors import UnsafeName
from singerlake.format.schema_hash import fingerprint_text

# Kept verbatim in a segment; everything else (including "." and upper case) is escaped.
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPE = "~"
MAX_SEGMENT_BYTES = 120
_TRUNCATED_MARK = "~~"
_ESCAPED = re.compile(r"~([0-9a-f]{2})")


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


def normalise_label(name: str) -> str:
    """The datalake record's ``where``/``what`` form: ``^[a-z0-9_-]+$``, at most 64 characters."""
    label = re.sub(r"[^a-z0-9_-]+", "_", name.lower()).strip("_")[:64]
    return label or f"n{fingerprint_text(name)}"
