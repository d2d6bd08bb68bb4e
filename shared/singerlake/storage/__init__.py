"""Open a lake root by URL: a local path, ``file://`` or ``s3://``."""

from __future__ import annotations

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
]


def open_storage(root: str | None = None, **s3_options) -> Storage:
    """``s3_options`` (region, profile, endpoint_url, keys) apply to ``s3://`` roots only."""
    root = root or DEFAULT_ROOT
    unknown = set(s3_options) - set(S3_OPTIONS)
    if unknown:
        raise StorageError(f"unknown storage options: {sorted(unknown)}")
    if root.startswith("s3://"):
        return S3Storage(root, **{k: v for k, v in s3_options.items() if v})
    if root.startswith("file://"):
        parsed = urlparse(root)
        if parsed.netloc not in ("", "localhost"):
            raise StorageError(f"file:// URL with a remote host is not supported: {root!r}")
        return LocalStorage(unquote(parsed.path))
    if "://" in root:
        raise StorageError(f"unsupported lake root {root!r}: use a local path, file:// or s3://")
    return LocalStorage(root)
