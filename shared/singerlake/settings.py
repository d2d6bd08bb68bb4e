"""Settings both plugins share: where the lake is and how to reach it (names, descriptions, secrets)."""

from __future__ import annotations

from typing import Any, NamedTuple

from singerlake.storage import DEFAULT_ROOT, S3_OPTIONS


class Setting(NamedTuple):
    name: str
    description: str
    secret: bool = False
    default: str | None = None


LAKE_LOCATION = (
    Setting("lake_root", "Lake root: a local path, a file:// URL or an s3://bucket/prefix URL.", default=DEFAULT_ROOT),
    Setting("s3_region", "S3 region (default: the standard AWS configuration)."),
    Setting("s3_profile", "AWS profile name for S3 credentials."),
    Setting("s3_endpoint_url", "S3 endpoint URL, for MinIO and other S3-compatible stores."),
    Setting("s3_access_key_id", "S3 access key id (default: the standard credential chain).", secret=True),
    Setting("s3_secret_access_key", "S3 secret access key.", secret=True),
    Setting("s3_session_token", "S3 session token, for temporary credentials.", secret=True),
)


def lake_root(config: dict[str, Any]) -> str:
    return config.get("lake_root") or DEFAULT_ROOT


def storage_options(config: dict[str, Any]) -> dict[str, Any]:
    """The ``s3_*`` settings as ``open_storage`` options."""
    return {name: config.get(f"s3_{name}") for name in S3_OPTIONS}
