"""Schema hash: FarmHash Fingerprint64 of a canonical JSON, as 13 Crockford base32 digits (SPEC.md §3)."""

from __future__ import annotations

import json
from typing import Any

import farmhash

# Crockford's base32: digits and lower-case letters without i, l, o, u. Path- and URL-safe, and
# no two digits differ only by case, so case-insensitive filesystems cannot merge two hashes.
_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
HASH_LENGTH = 13  # ceil(64 / 5)


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the same value always gives the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode64(number: int) -> str:
    digits = []
    for _ in range(HASH_LENGTH):
        digits.append(_ALPHABET[number & 31])
        number >>= 5
    return "".join(reversed(digits))


def fingerprint_text(text: str) -> str:
    return encode64(farmhash.fingerprint64(text.encode("utf-8", "surrogatepass")))


def schema_hash(schema: dict, key_properties: list[str] | None = None) -> str:
    """Hash of a stream's schema and key properties; key order inside the schema does not matter."""
    document = {"key_properties": list(key_properties or []), "schema": schema}
    return encode64(farmhash.fingerprint64(canonical_json(document)))


def is_schema_hash(text: str) -> bool:
    return len(text) == HASH_LENGTH and all(c in _ALPHABET for c in text)
