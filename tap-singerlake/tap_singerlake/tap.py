"""tap-singerlake (shell). Replay arrives with issue #4; only settings exist yet."""

from __future__ import annotations

from singer_sdk import Tap
from singer_sdk import typing as th


class TapSingerlake(Tap):
    name = "tap-singerlake"
    config_jsonschema = th.PropertiesList(
        th.Property("lake_root", th.StringType, default="./singerlake", description="Lake root: a local path, file:// or s3:// URL."),
        th.Property("tap_id", th.StringType, required=True, description="Which tap's data to replay."),
    ).to_dict()

    def discover_streams(self) -> list:
        return []


if __name__ == "__main__":
    TapSingerlake.cli()
