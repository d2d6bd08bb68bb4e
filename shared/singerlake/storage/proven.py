"""Lake roots a run on this machine has written to, remembered so a run on one again makes no probe (SPEC.md §10).

A probe of an S3 root (HeadBucket) tells a user at once that a setting is wrong, before any input is
read; a run's first requests tell the same. So once a run wrote to a root, an empty file named by a
digest of what reaches it (its URL, endpoint, region, profile and access key id, never a secret) under
``$SINGERLAKE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/singerlake`` or ``~/.cache/singerlake``) says so,
and later runs skip the probe. A remembered root that broke since fails at the run's first request
instead, with the same error; then it is forgotten. Local roots are always probed: that costs no
request. The memory only moves an error earlier or later, never changes what a run does; a cache that
cannot be written just means probing again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from singerlake.storage.base import Storage

_REACH = ("endpoint_url", "region", "profile", "access_key_id")  # what names the root and who writes it; no secrets


def cache_dir() -> Path:
    given = os.environ.get("SINGERLAKE_CACHE_DIR")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "singerlake"


def _marker(storage: Storage) -> Path:
    options = storage.open_options()
    digest = hashlib.sha256(json.dumps([storage.url, *(options.get(name) for name in _REACH)]).encode()).hexdigest()
    return cache_dir() / "writable-roots" / digest


def is_local(storage: Storage) -> bool:
    return not storage.url.startswith("s3://")


def is_proven(storage: Storage) -> bool:
    """Whether a run on this machine wrote to ``storage`` before (never for local roots: probing them is free)."""
    return not is_local(storage) and _marker(storage).exists()


def remember(storage: Storage) -> None:
    if is_local(storage):
        return
    marker = _marker(storage)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass  # no cache: the next run probes again


def forget(storage: Storage) -> None:
    try:
        _marker(storage).unlink(missing_ok=True)
    except OSError:
        pass
