"""A storage that counts what is asked of it: every ``Storage`` method of a wrapped storage, each call
recorded as (method, key) and counted under the kind of request it makes on S3.

Reads of a whole object are GET, of its etag alone (``read_etag``, ``exists``, ``root_exists``) HEAD: a
wrapper that left ``exists`` to the base class would count it as a GET (the base reads the etag through
``read``). ``sync`` and ``check_writable`` are counted under kinds of their own; ``open_options`` and
``url_of`` ask the storage nothing and are passed through uncounted. tests/test_support.py fails when a
``Storage`` method is not counted here, or is counted under another kind than the request it makes.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from singerlake.storage import Blob, ObjectInfo, Storage

GET, HEAD, PUT, DELETE, LIST = "GET", "HEAD", "PUT", "DELETE", "LIST"
REQUEST_KINDS = (GET, HEAD, PUT, DELETE, LIST)
KINDS = {
    "read": GET,
    "open_read": GET,
    "read_etag": HEAD,
    "exists": HEAD,
    "root_exists": HEAD,
    "write": PUT,
    "write_stream": PUT,
    "delete": DELETE,
    "list": LIST,
    "list_dirs": LIST,
    "leftovers": LIST,
    "stale_leftovers": LIST,
    "check_writable": "CHECK",  # a probe of the root (S3: HEAD of the bucket, then a PUT and a DELETE)
    "sync": "SYNC",  # local: fsync of what was written; S3: nothing
}
NOT_COUNTED = ("open_options", "url_of")  # answered from the storage's settings: no request


class Counting(Storage):
    """``inner`` with every call through it recorded in ``calls`` as (method, key); thread-safe. Pickled (to
    Spark executors), it is ``inner`` itself: what executors do is not counted, only this process's calls."""

    def __init__(self, inner: Storage):
        self.inner = inner
        self.url = inner.url
        self.parallel_requests = inner.parallel_requests
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    # -- what was counted ----------------------------------------------------------------------------
    @property
    def requests(self) -> list[tuple[str, str]]:
        """The calls that are requests to the storage (GET, HEAD, PUT, DELETE, LIST), in order."""
        with self._lock:
            return [(method, key) for method, key in self.calls if KINDS[method] in REQUEST_KINDS]

    def kinds(self) -> Counter:
        """How many calls of each kind."""
        with self._lock:
            return Counter(KINDS[method] for method, _ in self.calls)

    def clear(self) -> None:
        with self._lock:
            self.calls.clear()

    def _count(self, method: str, key: str):
        with self._lock:
            self.calls.append((method, key))
        return getattr(self.inner, method)

    def __getattr__(self, name):  # the backend's own attributes (an S3Storage's client, bucket, prefix)
        if name == "inner":
            raise AttributeError(name)  # not set yet (unpickling, copying): no recursion
        return getattr(self.inner, name)

    def __reduce__(self):
        return copy.copy, (self.inner,)

    # -- every Storage method ------------------------------------------------------------------------
    def read(self, key: str) -> Blob:
        return self._count("read", key)(key)

    def open_read(self, key: str) -> BinaryIO:
        return self._count("open_read", key)(key)

    def read_etag(self, key: str) -> str:
        return self._count("read_etag", key)(key)

    def exists(self, key: str) -> bool:
        return self._count("exists", key)(key)

    def root_exists(self) -> bool:
        return self._count("root_exists", "")()

    def write(self, key: str, data: bytes, **options) -> str:
        return self._count("write", key)(key, data, **options)

    def write_stream(self, key: str, chunks: Iterable[bytes], **options) -> None:
        return self._count("write_stream", key)(key, chunks, **options)

    def delete(self, key: str, **options) -> None:
        return self._count("delete", key)(key, **options)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        return self._count("list", prefix)(prefix, start_after)

    def list_dirs(self, prefix: str) -> list[str]:
        return self._count("list_dirs", prefix)(prefix)

    def leftovers(self, prefix: str) -> Iterator[ObjectInfo]:
        return self._count("leftovers", prefix)(prefix)

    def stale_leftovers(self, prefix: str, cutoff_ms: float) -> list[ObjectInfo]:
        return self._count("stale_leftovers", prefix)(prefix, cutoff_ms)

    def check_writable(self) -> None:
        return self._count("check_writable", "")()

    def sync(self, keys) -> None:
        return self._count("sync", "")(keys)

    def open_options(self) -> dict[str, str]:
        return self.inner.open_options()

    def url_of(self, key: str) -> str:
        return self.inner.url_of(key)

    def __repr__(self) -> str:
        return f"Counting({self.inner!r})"
