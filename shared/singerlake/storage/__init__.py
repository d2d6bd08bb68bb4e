"""Open a lake root by URL: a local path, ``file://`` or ``s3://``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlparse

from singerlake.storage.base import Blob, NotFound, ObjectInfo, PreconditionFailed, Storage, StorageError
from singerlake.storage.local import LocalStorage
from singerlake.storage.s3 import S3Storage

DEFAULT_ROOT = "./singerlake"

S3_OPTIONS = ("region", "profile", "endpoint_url", "access_key_id", "secret_access_key", "session_token")

__all__ = [
    "Blob",
    "DEFAULT_ROOT",
    "LocalStorage",
    "NotFound",
    "ObjectInfo",
    "PreconditionFailed",
    "S3Storage",
    "Storage",
    "StorageError",
    "open_storage",
    "s3_options",
]


def s3_options(get: Callable[[str], Any], prefix: str = "s3_") -> dict[str, Any]:
    """The ``open_storage`` options of a command line, a plugin's settings or a data source's options:
    each option ``get(prefix + name)`` (``s3_region``, ``s3_endpoint_url``...), None where not given."""
    return {name: get(prefix + name) for name in S3_OPTIONS}


def open_storage(root: str | None = None, **options) -> Storage:
    """The S3 ``options`` (region, profile, endpoint_url, keys) apply to ``s3://`` roots only."""
    root = root or DEFAULT_ROOT
    unknown = set(options) - set(S3_OPTIONS)
    if unknown:
        raise StorageError(f"unknown storage options: {sorted(unknown)}")
    if root.startswith("s3://"):
        return S3Storage(root, **{k: v for k, v in options.items() if v})
    if root.startswith("file://"):
        parsed = urlparse(root)
        if parsed.netloc not in ("", "localhost"):
            raise StorageError(f"file:// URL with a remote host is not supported: {root!r}")
        return LocalStorage(unquote(parsed.path))
    if "://" in root:
        raise StorageError(f"unsupported lake root {root!r}: use a local path, file:// or s3://")
    return LocalStorage(root)
