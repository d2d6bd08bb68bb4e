"""Reading Singer messages fast and exactly: only the envelope is decoded, the record stays raw bytes."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from singerlake.singer_file import parse_time_ms


class BadInput(ValueError):
    """Input that is not valid Singer; the message names the line (and stream)."""


class RecordBeforeSchema(BadInput):
    pass


class MissingKeyProperties(BadInput):
    pass


class Envelope(msgspec.Struct):
    """The parts of a message the target routes on. ``record`` is validated JSON, left undecoded."""

    type: str
    stream: str | None = None
    time_extracted: str | None = None
    record: msgspec.Raw = msgspec.Raw(b"")


class _SdcTime(msgspec.Struct):
    extracted_at: Any = msgspec.field(default=None, name="_sdc_extracted_at")


_envelope = msgspec.json.Decoder(Envelope)
_sdc = msgspec.json.Decoder(_SdcTime)
_top_level = msgspec.json.Decoder(dict[str, msgspec.Raw])


def decode_envelope(line: bytes, number: int) -> Envelope:
    try:
        return _envelope.decode(line)
    except msgspec.ValidationError as exc:
        raise BadInput(f"line {number}: not a Singer message: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BadInput(f"line {number}: malformed JSON: {exc}") from None


def decode_full(line: bytes, number: int) -> dict:
    try:
        message = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"line {number}: malformed JSON: {exc}") from None
    if not isinstance(message, dict):
        raise BadInput(f"line {number}: a Singer message must be a JSON object")
    return message


def record_keys(record: msgspec.Raw, number: int, stream: str) -> dict[str, msgspec.Raw]:
    try:
        return _top_level.decode(record)
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise BadInput(f"line {number}: RECORD for stream {stream!r} must hold a JSON object in 'record'") from None


def sdc_extracted_at(record: msgspec.Raw) -> Any:
    try:
        return _sdc.decode(record).extracted_at
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


class TimeParser:
    """ISO 8601 UTC text to ms, caching whole seconds: most records share a second with a neighbour."""

    def __init__(self) -> None:
        self._seconds: dict[str, int] = {}

    def __call__(self, text: Any) -> int | None:
        if not isinstance(text, str) or len(text) < 20:
            return parse_time_ms(text)
        head, tail = text[:19], text[19:]
        if tail.endswith("Z"):
            zone = 1
        elif tail.endswith("+00:00"):
            zone = 6
        else:
            return parse_time_ms(text)
        fraction = tail[1:-zone] if tail[0] == "." else tail[:-zone]
        if fraction and not (tail[0] == "." and fraction.isdigit()):
            return parse_time_ms(text)
        seconds = self._seconds.get(head)
        if seconds is None:
            parsed = parse_time_ms(head + "Z")
            if parsed is None:
                return None
            if len(self._seconds) > 100_000:
                self._seconds.clear()
            seconds = self._seconds[head] = parsed // 1000
        return seconds * 1000 + (int(fraction[:3].ljust(3, "0")) if fraction else 0)
