"""target-singerlake (shell). Landing through Spark arrives with issue #3; only settings exist yet."""

from __future__ import annotations

from singer_sdk import Target
from singer_sdk import typing as th
from singer_sdk.sinks import RecordSink


class NotYetSink(RecordSink):
    def process_record(self, record: dict, context: dict) -> None:
        raise NotImplementedError("target-singerlake cannot land records yet (issue #3)")


class TargetSingerlake(Target):
    name = "target-singerlake"
    default_sink_class = NotYetSink
    config_jsonschema = th.PropertiesList(
        th.Property("lake_root", th.StringType, default="./singerlake", description="Lake root: a local path, file:// or s3:// URL."),
        th.Property("tap_id", th.StringType, description="Tap id the data is filed under; defaults to $MELTANO_EXTRACTOR_NAME."),
    ).to_dict()


if __name__ == "__main__":
    TargetSingerlake.cli()
