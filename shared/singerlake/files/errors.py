"""The errors of files/: one family, ``FilesError``, each a ``SingerlakeError`` whose message names the thing at fault."""

from __future__ import annotations

from singerlake.errors import SingerlakeError
from singerlake.text import counted


class FilesError(SingerlakeError):
    """Any file (SPEC.md §14-§15): a push or fetch that could not complete."""


class Aborted(FilesError):
    """A vacuum aborted this push's txn (SPEC.md §15): nothing of it was committed; store it again under a new txn."""


class FileChanged(FilesError):
    """A file changed while it was pushed; nothing of it was stored."""


class PushAborted(FilesError):
    """Vacuums kept aborting a chunk's txn (SPEC.md §15); nothing of it was committed."""


class PushFailed(FilesError):
    """Some files could not be stored; the chunks without such a file were committed."""


class FetchFailed(FilesError):
    """Some files could not be fetched; the others were. ``outcomes``: what became of each."""

    def __init__(self, outcomes: list):  # of files.fetch.Fetched
        failed = [o for o in outcomes if o.failed]
        first = failed[0]
        counts = f"{len(failed):,} of {counted(len(outcomes), 'file')} not fetched (the others were)"
        super().__init__(f"{counts}: {first.record['id']} -> {first.place}: {first.error}")
        self.outcomes = outcomes
