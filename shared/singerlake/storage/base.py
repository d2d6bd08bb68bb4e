"""The storage interface every backend implements: keys relative to the lake root, conditional writes."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from singerlake.errors import SingerlakeError, UnsafeName

LEFTOVER_AGE_S = 3600  # a temp file younger than this may be a write under way


class StorageError(SingerlakeError):
    """A storage operation failed; the message names the object."""


class NotFound(StorageError):
    pass


class PreconditionFailed(StorageError):
    """A conditional write lost: the object exists (If-None-Match) or changed (If-Match)."""


def check_key(key: str) -> str:
    """Reject keys that could leave the lake root (defence in depth below the encoders)."""
    parts = key.split("/")
    if not key or key.startswith("/") or "\\" in key or any(p in ("", ".", "..") for p in parts):
        raise UnsafeName(f"refusing unsafe lake key {key!r}")
    return key


@dataclass(frozen=True)
class Blob:
    data: bytes
    etag: str


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float  # seconds since the epoch


class Storage(ABC):
    """A lake root. ``url`` is what users configured (never carries secrets)."""

    url: str
    # Requests worth keeping in flight at once from one process (e.g. commits of many streams).
    parallel_requests: int = 8

    @abstractmethod
    def read(self, key: str) -> Blob:
        """Whole object and its etag; raises NotFound."""

    @abstractmethod
    def write(
        self,
        key: str,
        data: bytes,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
        durable: bool = True,
        content_type: str | None = None,
    ) -> str:
        """Write atomically and return the new etag.

        ``if_none_match``: only create (PreconditionFailed when the key exists).
        ``if_match``: only replace the version with this etag (PreconditionFailed otherwise).
        ``durable=False``: the write may be lost in a power failure (never in a process crash): for
        objects that only coordinate live processes, such as locks (a lost lock is stale anyway), or
        for many objects made durable at once by ``sync`` before anything depends on them.
        ``content_type``: the media type a web server should give it (S3 keeps it; local files ignore it).
        """

    def write_stream(self, key: str, chunks: Iterable[bytes], *, if_none_match: bool = False, content_type: str | None = None) -> None:
        """Write an object too large to hold in memory, from ``chunks``, atomically: nothing is
        visible under ``key`` unless every chunk arrived, so a chunk iterator that raises (a source
        file that changed) stores nothing. ``if_none_match`` as for ``write``. Backends stream; this
        fallback (for wrappers) joins the chunks."""
        self.write(key, b"".join(chunks), if_none_match=if_none_match, content_type=content_type)

    @abstractmethod
    def delete(self, key: str, *, if_match: str | None = None) -> None:
        """Delete; with ``if_match`` only that version (PreconditionFailed otherwise). Missing is fine."""

    @abstractmethod
    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order; with ``start_after``, only keys
        after it (S3 lists from there: a log's newest entries cost one request however long it grew)."""

    @abstractmethod
    def list_dirs(self, prefix: str) -> list[str]:
        """Names of the immediate "directories" under ``prefix`` (which ends with ``/`` or is empty)."""

    @abstractmethod
    def open_read(self, key: str) -> BinaryIO:
        """A streaming reader, for objects too large to hold in memory; raises NotFound."""

    @abstractmethod
    def root_exists(self) -> bool:
        """Whether the root itself (directory, bucket) exists; a missing lake is an error for readers."""

    @abstractmethod
    def check_writable(self) -> None:
        """Fail fast with a clear error when the root cannot be written."""

    def sync(self, keys: Iterable[str]) -> None:
        """Make the objects at ``keys`` durable, names included, whoever wrote them (``durable=False``
        writes of this process or of executors): one call after many writes instead of one sync per
        object. A no-op where every write is durable when it returns (S3)."""
        return

    def exists(self, key: str) -> bool:
        try:
            self.read_etag(key)
            return True
        except NotFound:
            return False

    def read_etag(self, key: str) -> str:
        return self.read(key).etag

    def leftovers(self, prefix: str) -> Iterator[ObjectInfo]:
        """Partial writes a crash left behind (never visible under a real key); none where writes are atomic."""
        return iter(())

    def stale_leftovers(self, prefix: str, cutoff_ms: float) -> list[ObjectInfo]:
        """The leftovers written before ``cutoff_ms`` and at least LEFTOVER_AGE_S ago, however early the
        cutoff: a write under way holds its temp file until it is done, so a younger one may be live."""
        before = min(cutoff_ms, (time.time() - LEFTOVER_AGE_S) * 1000)
        return [info for info in self.leftovers(prefix) if info.mtime * 1000 <= before]

    def open_options(self) -> dict[str, str]:
        """The options ``open_storage(url, **options)`` needs to open this root again (elsewhere)."""
        return {}

    def url_of(self, key: str) -> str:
        return f"{self.url.rstrip('/')}/{key}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
