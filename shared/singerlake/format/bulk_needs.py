"""A block of RECORD lines' column statistics in bulk (SPEC.md §5): ``exact.records_needs`` of their
records, found by one typed decoder call and a check per column instead of a need per value.

The decoder is made from the schema's properties. It takes a block only when every value is of its
column's kind in the form whose need is that kind's plain need: integers within 64 bits, booleans,
strings, objects holding declared keys only, lists of such values, nulls anywhere. Such a column
needs its plain need when it holds a value, null otherwise, which ``any`` tells from its first value.
Three kinds are checked after: numbers keep their JSON text (``msgspec.Raw``), whose digits give
their need (``numbers_need``, in numpy); date and time strings all in one strict form are checked at
once (``in_valid_form``), others one by one as ``exact`` parses them; JSON-text columns need
``"json"`` as soon as they hold a value. Top-level keys the schema does not declare are learned from
the decoder's error and read as text (``undeclared``). Anything else (a value of another kind, an
integer beyond 64 bits, an undeclared key in a nested object, a line the decoder reads otherwise
than ``needs.records_of``) makes ``block_needs`` None, and the caller finds the block's needs value
by value, with the same result.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterable
from decimal import Decimal
from functools import lru_cache
from itertools import chain, repeat
from operator import attrgetter, is_not
from typing import Annotated, Any

import msgspec

from singerlake.format.columnar import STRICT_FORMS
from singerlake.format.exact import INT64, MAX_DIGITS, Need, _decimal, _nested, _number_need, declared, join, parse_date, parse_timestamp

PLAIN_KINDS = {"integer": "long", "bool": "bool", "string": "string"}  # kinds the decoder checks whole
TIME_PARSERS = {"timestamp": parse_timestamp, "date": parse_date}
ABSENT = msgspec.Raw(b"")  # a text column's value where the record has no such key (a JSON value is never empty)
MAX_LEARNED = 64  # undeclared top-level keys a block may teach the decoder; beyond, the block is read value by value
_UNKNOWN = re.compile(r"Object contains unknown field `(.*)` - at `\$\[\d+\]\.record`")

Long = Annotated[int, msgspec.Meta(ge=INT64[0], le=INT64[1])]


def _field(spec: Any) -> tuple[Any, Any]:
    """The type a property's values are decoded as (null included), and its default when absent."""
    kind = declared(spec)
    if kind == "integer":
        return Long | None, None
    if kind == "bool":
        return bool | None, None
    if kind in ("string", "timestamp", "date"):
        return str | None, None
    if kind == "struct":
        return _struct(tuple(spec["properties"].items())) | None, None
    if kind == "list":
        return list[_field(spec["items"])[0]] | None, None
    return msgspec.Raw, ABSENT  # numbers and JSON text: their text (a null is the text ``null``)


def _struct(properties: tuple[tuple[str, Any], ...], undeclared: tuple[str, ...] = ()) -> type:
    """A struct of the declared properties (fields p0, p1, ... named as the properties) refusing other
    keys, and of the ``undeclared`` keys (u0, u1, ...) read as text."""
    fields = [(f"p{index}", *_field(spec)) for index, (_, spec) in enumerate(properties)]
    fields += [(f"u{index}", msgspec.Raw, ABSENT) for index in range(len(undeclared))]
    names = {f"p{index}": name for index, (name, _) in enumerate(properties)}
    names.update({f"u{index}": name for index, name in enumerate(undeclared)})
    return msgspec.defstruct("Values", fields, rename=names, forbid_unknown_fields=True, gc=False)


@lru_cache(maxsize=256)
def _decoder(schema: bytes, undeclared: tuple[str, ...]) -> msgspec.json.Decoder | None:
    """The decoder of RECORD lines under the properties whose JSON is ``schema`` (one per schema and
    learned keys); None when a name cannot name a field (a quote, a backslash, a control character)."""
    properties = tuple(msgspec.json.decode(schema).items())
    try:
        values = _struct(properties, undeclared)
    except ValueError:
        return None
    # a line without a record holds no value (null: read value by value, as a record that is no object)
    line = msgspec.defstruct("Line", [("record", values, msgspec.field(default_factory=values))], gc=False)
    return msgspec.json.Decoder(line)


class BlockNeeds:
    """Finds the needs of blocks of RECORD lines under one schema's ``properties``."""

    def __init__(self, properties: dict[str, Any]):
        self.properties = properties
        self._schema = msgspec.json.encode(properties)
        # each column read straight from the decoded lines: most columns stop at their first value
        self._columns = [(name, spec, attrgetter(f"record.p{index}")) for index, (name, spec) in enumerate(properties.items())]
        self.undeclared: tuple[str, ...] = ()  # learned so far: later blocks are read with them

    def block_needs(self, lines: bytes, count: int | None = None) -> tuple[dict[str, Need], set[str]] | None:
        """The needs and undeclared keys of the records of ``lines`` (newline-terminated RECORD lines,
        ``count`` of them when known), or None when they must be found value by value."""
        decoded = self._decode(lines)
        if decoded is None or len(decoded) != (lines.count(b"\n") if count is None else count):  # a blank line, or two values on one
            return None
        needs = {name: column_need(spec, map(get, decoded)) for name, spec, get in self._columns}
        found = set()
        for index, name in enumerate(self.undeclared):
            if any(map(is_not, map(attrgetter(f"record.u{index}"), decoded), repeat(ABSENT))):
                found.add(name)
        return needs, found

    def _decode(self, lines: bytes) -> list | None:
        while (decoder := _decoder(self._schema, self.undeclared)) is not None:
            try:
                return _without_gc(decoder, lines)
            except msgspec.ValidationError as exc:
                unknown = _UNKNOWN.fullmatch(str(exc))
                name = unknown and unknown.group(1)
                if not name or name in self.undeclared or name in self.properties or len(self.undeclared) >= MAX_LEARNED:
                    return None
                self.undeclared += (name,)
            except msgspec.DecodeError:
                return None
        return None


def _without_gc(decoder: msgspec.json.Decoder, lines: bytes) -> list:
    """``decoder.decode_lines(lines)`` with the cyclic collector paused: the decoded lists (and the
    result) would start a collection every few hundred values, each walking every young object
    (half the decoding time, 1M records), and what it makes holds no cycle. One C call under the
    GIL: no other thread runs meanwhile, and only the caller that paused it starts it again."""
    if not gc.isenabled():
        return decoder.decode_lines(lines)
    gc.disable()
    try:
        return decoder.decode_lines(lines)
    finally:
        gc.enable()


def column_need(spec: Any, values: Iterable) -> Need:
    """``exact.column_need`` of a column as the decoder gave it (null or absent: None; in text
    columns ``ABSENT`` and the text ``null``)."""
    kind = declared(spec)
    if kind in PLAIN_KINDS:
        return PLAIN_KINDS[kind] if any(value is not None for value in values) else None
    if _by_presence(spec):
        return _Presence(spec).need(values)
    if kind == "number":
        return numbers_need(b"\n".join(values))
    values = list(values)
    if kind in TIME_PARSERS:
        present = [value for value in values if value is not None] if None in values else values
        return (kind if all_times(present, kind) else "json") if present else None
    if kind == "struct":
        present = list(filter(None, values))  # a struct is true, None is not
        children = enumerate(spec["properties"].items())
        need = {name: column_need(child, map(attrgetter(f"p{index}"), present)) for index, (name, child) in children}
        return _nested({"struct": need}) if present else None
    if kind == "list":
        filled = list(filter(None, values))  # the lists holding items
        if not filled and all(value is None for value in values):
            return None
        return _nested({"list": column_need(spec["items"], chain.from_iterable(filled))})
    return "json" if any(value is not ABSENT and bytes(value) != b"null" for value in values) else None


def _by_presence(spec: Any) -> bool:
    """Whether a column's need follows from which of its parts hold a value: no number, date or time
    anywhere in it (the decoder checked each value's kind; JSON text needs ``"json"`` whatever it holds)."""
    kind = declared(spec)
    if kind == "struct":
        return all(_by_presence(child) for child in spec["properties"].values())
    if kind == "list":
        return _by_presence(spec["items"])
    return kind not in ("number", *TIME_PARSERS)


def _holds(value: Any) -> bool:
    """Whether a decoded value is one (not null, not absent)."""
    return value is not None and value is not ABSENT and not (isinstance(value, msgspec.Raw) and bytes(value) == b"null")


class _Presence:
    """Which parts of a column (``_by_presence``) hold a value, seen value by value until every part
    has shown one (mostly at the first record), then its need."""

    def __init__(self, spec: Any):
        self.kind = declared(spec)
        self.held = False
        self.done = False
        if self.kind == "struct":
            self.children = [
                (name, attrgetter(f"p{index}"), _Presence(child)) for index, (name, child) in enumerate(spec["properties"].items())
            ]
        elif self.kind == "list":
            self.items = _Presence(spec["items"])

    def see(self, value: Any) -> None:
        """Note a value (not null) of this part."""
        self.held = True
        if self.kind == "struct":
            for _, get, child in self.children:
                if not child.done and _holds(part := get(value)):
                    child.see(part)
            self.done = all(child.done for _, _, child in self.children)
        elif self.kind == "list":
            for item in value:
                if self.items.done:
                    break
                if _holds(item):
                    self.items.see(item)
            self.done = self.items.done
        else:
            self.done = True

    def need(self, values: Iterable) -> Need:
        for value in values:
            if _holds(value):
                self.see(value)
                if self.done:
                    break
        return self.found()

    def found(self) -> Need:
        if not self.held:
            return None
        if self.kind == "struct":
            return _nested({"struct": {name: child.found() for name, _, child in self.children}})
        if self.kind == "list":
            return _nested({"list": self.items.found()})
        return PLAIN_KINDS.get(self.kind, "json")


def all_times(texts: list[str], kind: str) -> bool:
    """Whether every text is a date or time of ``kind`` as ``exact`` parses it: all at once when they
    share one strict form, else one by one."""
    parse = TIME_PARSERS[kind]
    if in_valid_form(texts, kind) and parse(texts[0]) is not None:  # the form itself, as this Python reads it
        return True
    return all(parse(text) is not None for text in texts)


DAYS = [0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]  # February's 29th is checked against the year


def in_valid_form(texts: list[str], kind: str) -> bool:
    """Whether the texts all have one of ``columnar.STRICT_FORMS`` (the same one) and hold valid dates
    and times in it: years 1-9999, months, days of the month, hours 0-23, minutes and seconds 0-59."""
    import numpy as np

    width = len(texts[0])
    data = ("\n".join(texts) + "\n").encode()
    form = next((form for form in STRICT_FORMS[kind] if len(form) == width), None)
    if form is None or len(data) != len(texts) * (width + 1):
        return False
    rows = np.frombuffer(data, np.uint8).reshape(len(texts), width + 1)
    template = np.frombuffer(form + b"\n", np.uint8)
    digit = template == ord("d")
    digits = rows[:, digit]
    if not (((digits >= ord("0")) & (digits <= ord("9"))).all() and (rows[:, ~digit] == template[~digit]).all()):
        return False

    def number(start: int, stop: int):
        value = np.zeros(len(texts), np.int32)
        for place in range(start, stop):
            value = value * 10 + (rows[:, place] - ord("0"))
        return value

    year, month, day = number(0, 4), number(5, 7), number(8, 10)
    if not ((year >= 1).all() and (month >= 1).all() and (month <= 12).all() and (day >= 1).all()):
        return False
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    days = np.array(DAYS, np.int32)[month] - ((month == 2) & ~leap)
    if not (day <= days).all():
        return False
    return kind == "date" or bool((number(11, 13) <= 23).all() and (number(14, 16) <= 59).all() and (number(17, 19) <= 59).all())


def numbers_need(texts: bytes) -> Need:
    """What JSON values of a column declared ``number`` need, joined, from their texts (one a line,
    as written; an empty line: no value): ``exact._number_need`` of each, from its digits. A non-null
    value that is no number needs ``"json"``; numbers with an exponent are decoded and judged one by one."""
    import numpy as np

    data = np.frombuffer(texts, np.uint8)
    ends = np.append(np.flatnonzero(data == ord("\n")), len(data))
    starts = np.concatenate(([0], ends[:-1] + 1))
    filled = ends > starts
    starts, ends = starts[filled], ends[filled]
    if not len(starts):
        return None
    first = data[starts]
    null = first == ord("n")
    number = (first == ord("-")) | ((first >= ord("0")) & (first <= ord("9")))
    if not (null | number).all():
        return "json"  # a string, a boolean, an object or a list
    need: Need = None
    exponent = np.zeros(len(starts), bool)
    exponent[np.searchsorted(ends, np.flatnonzero((data | 0x20) == ord("e")))] = True  # `null` holds no e
    for index in np.flatnonzero(exponent):
        need = join(need, _number_need("number", Decimal(texts[starts[index] : ends[index]].decode())))
    plain = number & ~exponent
    if not plain.any():
        return need
    dots = np.flatnonzero(data == ord("."))
    dot = np.full(len(starts), -1)
    dot[np.searchsorted(ends, dots)] = dots
    significant = np.where((data >= ord("1")) & (data <= ord("9")), np.arange(len(data)), -1)
    last = np.maximum.reduceat(significant, starts)  # the last non-zero digit of each value; -1: none
    sign = (first == ord("-")).astype(np.int64)
    whole = dot < 0
    zero_units = (dot - starts - sign == 1) & (data[np.maximum(starts + sign, 0)] == ord("0"))  # "0.x"
    integer_digits = np.where(whole, ends - starts - sign, np.where(zero_units | (last < 0), 0, dot - starts - sign))
    scale = np.where(whole, 0, np.where(last < 0, ends - dot - 1, np.maximum(last - dot, 0)))
    integer_digits, scale = integer_digits[plain], scale[plain]
    if (integer_digits + scale > MAX_DIGITS).any():
        return "json"
    return join(need, _decimal(int(integer_digits.max()), int(scale.max())))
