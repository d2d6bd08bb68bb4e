"""The errors of commits/: one family, ``CommitError``, each a ``SingerlakeError`` whose message names the thing at fault."""

from __future__ import annotations

from singerlake.errors import SingerlakeError


class CommitError(SingerlakeError):
    """Locks and commits (SPEC.md §8-§9): a lock that could not be had or was lost, a commit that could not happen."""


class LockTimeout(CommitError):
    """The lock stayed held by a live writer for longer than the configured wait."""


class LockLost(CommitError):
    """Another writer took the lock over; this holder must stop writing."""


class CommitConflict(CommitError):
    """Too many writers raced for the same object; nothing was committed."""


class CommitRejected(CommitError):
    """The commit may not happen at all (e.g. the writer lost its lock); nothing was committed."""


class Overtaken(CommitRejected):
    """The manifest registers another writer (``owner``) that the committing one cannot tell to be
    earlier: a writer still holding its lock proves it and commits again (SPEC.md §9)."""

    def __init__(self, message: str, owner: str):
        super().__init__(message)
        self.owner = owner


class LockNeeded(CommitError):
    """A commit tried without the lock found that it must take it (SPEC.md §9); nothing was written."""
