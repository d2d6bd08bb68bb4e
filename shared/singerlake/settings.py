"""Settings both plugins share: where the lake is and how to reach it (names, descriptions, secrets)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

from singerlake.errors import ConfigError
from singerlake.storage import DEFAULT_ROOT, s3_options


class Setting(NamedTuple):
    name: str
    description: str
    secret: bool = False


LAKE_LOCATION = (
    Setting(
        "lake_root",
        "Lake root: a local path, a file:// URL or an s3://bucket/prefix URL (default: $SINGERLAKE_LAKE_ROOT, else ./singerlake).",
    ),
    Setting("s3_region", "S3 region (default: the standard AWS configuration)."),
    Setting("s3_profile", "AWS profile name for S3 credentials."),
    Setting("s3_endpoint_url", "S3 endpoint URL, for MinIO and other S3-compatible stores."),
    Setting("s3_access_key_id", "S3 access key id (default: the standard credential chain).", secret=True),
    Setting("s3_secret_access_key", "S3 secret access key.", secret=True),
    Setting("s3_session_token", "S3 session token, for temporary credentials.", secret=True),
)


def shared(name: str) -> str | None:
    """A lake setting from ``$SINGERLAKE_<NAME>``: set once (e.g. in a Meltano project's ``.env``), it serves the
    target, the tap and the ``singerlake`` command alike, wherever their own configuration leaves it out."""
    return os.environ.get(f"SINGERLAKE_{name.upper()}") or None


def lake_root(config: dict[str, Any]) -> str:
    return config.get("lake_root") or shared("lake_root") or DEFAULT_ROOT


def storage_options(config: dict[str, Any]) -> dict[str, Any]:
    """The ``s3_*`` settings as ``open_storage`` options."""
    return s3_options(lambda name: config.get(name) or shared(name))


def config_paths(argv: list[str]) -> Iterator[str]:
    """The ``--config`` values of a plugin's command line: files, or ``ENV`` (settings from the environment)."""
    for index, arg in enumerate(argv):
        if arg == "--config" and index + 1 < len(argv):
            path = argv[index + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            continue
        yield path


def check_config_files(argv: list[str]) -> None:
    """Each ``--config`` file must be a JSON object: else one error naming the file (the SDK's is a traceback)."""
    for path in config_paths(argv):
        if path == "ENV":
            continue
        try:
            with open(path, encoding="utf-8") as handle:
                loaded = json.load(handle)
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ConfigError(f"config file {path}: not JSON ({exc})") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: settings must be a JSON object, got a {type(loaded).__name__}")


def invalid_settings(exc: Exception) -> ConfigError:
    """The SDK's ConfigValidationError (one logged line per problem, exit 1) as one error."""
    return ConfigError("invalid settings: " + "; ".join(getattr(exc, "errors", None) or [str(exc)]))
