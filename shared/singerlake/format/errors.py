"""The errors of the format: one family, ``FormatError``, each a ``SingerlakeError`` whose message names the thing at fault."""

from __future__ import annotations

from singerlake.errors import SingerlakeError


class FormatError(SingerlakeError):
    """The lake's format (SPEC.md §1-§7, §11): a document, data file or bookmark that breaks it, and input that is not Singer."""


class BadInput(FormatError, ValueError):
    """Input that is not valid Singer; the message names the line (and stream)."""


class RecordBeforeSchema(BadInput):
    """A RECORD of a stream before any SCHEMA of it (the Singer SDK's RecordsWithoutSchemaException)."""


class MissingKeyProperties(BadInput):
    """A record without a value for one of its stream's key properties."""


class ProjectionError(FormatError, ValueError):
    """Records that cannot be typed as their table says; the message names the column at fault."""


class InvalidMetadata(FormatError, ValueError):
    """A metadata record breaks the format; the message names the field."""


class NewerFormat(FormatError):
    """A document of a newer lake format. Not InvalidMetadata: repair must never rebuild it as an older one."""


class CorruptFile(FormatError, ValueError):
    """A stored file (a data file, a pushed file) that cannot be read back as recorded; the message names it."""


class BadBookmark(FormatError, ValueError):
    """A state bookmark that does not fit the lake; the message names the stream."""
