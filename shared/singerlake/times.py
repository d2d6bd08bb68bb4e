"""Times and ids in one place: the clock, the lake's timestamp texts, UUIDv7 file ids, and the rule
for the time a record is filed under (SPEC.md §1, §4, §11)."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from typing import Any

from singerlake.errors import BadArgument

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


def parse_time_ms(value: object) -> int | None:
    """ISO 8601 / RFC 3339 text to ms since the epoch (naive means UTC); None when unparsable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        # A trailing Z spelled as an offset: Python 3.10's fromisoformat (still supported) rejects "Z".
        dt = datetime.fromisoformat(value[:-1] + "+00:00" if value[-1] in "Zz" else value)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    ms = to_ms(dt)
    return ms if ms >= 0 else None  # start/end are ms since the epoch (SPEC.md §5): earlier is unusable


def record_time_ms(
    time_extracted: Any, sdc_extracted_at: Callable[[], Any], received_ms: int | None = None, parse=parse_time_ms
) -> int | None:
    """The time a record is filed under (SPEC.md §1): the message's ``time_extracted``, else the
    record's ``_sdc_extracted_at`` (asked for only when needed: finding it may cost a decode), else
    ``received_ms``. A time at the epoch (0) is a time, not a missing one."""
    found = parse(time_extracted)
    if found is None:
        found = parse(sdc_extracted_at())
    return received_ms if found is None else found


def day_of(ms: int) -> str:
    """The UTC day of a time, ``yyyy-mm-dd``: a time bucket of the files index (SPEC.md §14)."""
    return (EPOCH + timedelta(milliseconds=ms)).strftime("%Y-%m-%d")


def days_between(start_ms: int, end_ms: int) -> list[str]:
    """Every UTC day from ``start_ms``'s through ``end_ms``'s."""
    first = (EPOCH + timedelta(milliseconds=start_ms)).date()
    last = (EPOCH + timedelta(milliseconds=end_ms)).date()
    return [(first + timedelta(days=n)).isoformat() for n in range((last - first).days + 1)]


MS_THRESHOLD = 100_000_000_000  # a number above this is ms since the epoch (datalake's rule), else seconds
DAY_MS = 86_400_000
BEFORE_NOW = re.compile(r"-(\d+(?:\.\d+)?)([smhdw])")  # -30m, -2h, -1d: a time before now
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": DAY_MS, "w": 7 * DAY_MS}
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
TIME_FORMS = "ISO 8601 (2026-11-20, 2026-11-20T12:00:00Z), now, today, yesterday, -30m, -2h, -1d, or seconds or ms since the epoch"


def parse_when(text: str, name: str, end: bool = False) -> int:
    """A time a user typed (SPEC.md §14): ISO 8601, ``now``, ``today``, ``yesterday``, a time before now
    (``-30m``, ``-2h``, ``-1d``), or seconds or (above 1e11) milliseconds since the epoch. A day alone
    (a date, ``today``, ``yesterday``) is its first ms, or its last as an ``end``. ``name`` names the
    argument in the error (``BadArgument``)."""
    text = str(text).strip()
    word = text.lower()
    if word == "now":
        return now_ms()
    if word in ("today", "yesterday"):
        day = now_ms() // DAY_MS * DAY_MS - (DAY_MS if word == "yesterday" else 0)
        return day + DAY_MS - 1 if end else day
    if before := BEFORE_NOW.fullmatch(word):
        return now_ms() - int(float(before[1]) * _UNIT_MS[before[2]])
    try:
        number = float(text)
    except ValueError:
        ms = _iso_ms(text, name)
        return ms + DAY_MS - 1 if end and _DATE.fullmatch(text) else ms
    if number != number:
        raise BadArgument(name, f"{text!r} is not a time: expected {TIME_FORMS}")
    if number < 0:
        units = ", ".join(f"{text}{unit}" for unit in "mhd")
        raise BadArgument(name, f"{text!r}: a time before now takes a unit ({units}); a number is a time since 1970-01-01")
    return int(number) if number > MS_THRESHOLD else int(number * 1000)


def _iso_ms(text: str, name: str) -> int:
    try:
        # A trailing Z spelled as an offset: Python 3.10's fromisoformat (still supported) rejects "Z".
        dt = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text)
    except ValueError as exc:
        reason = str(exc)
        if not _DATE.match(text) or reason.startswith("Invalid isoformat"):
            raise BadArgument(name, f"{text!r} is not a time: expected {TIME_FORMS}") from None
        raise BadArgument(name, f"{text!r} is not a valid {'time' if _valid_date(text[:10]) else 'date'}: {reason}") from None
    ms = to_ms(dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc))
    if ms < 0:
        raise BadArgument(name, f"{text!r} is before 1970-01-01: a time must be at or after it")
    return ms


def _valid_date(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True
