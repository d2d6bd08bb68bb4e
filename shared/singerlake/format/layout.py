"""Lake layout: the keys of every lake object (SPEC.md §1).

Keys are relative to the lake root and always use ``/``.
"""

from __future__ import annotations

from dataclasses import dataclass

from singerlake.format.names import encode_segment
from singerlake.storage.base import check_key
from singerlake.times import format_ts, parse_ts

RAW = "raw"
ROOT_METADATA = f"{RAW}/singerlake.json"
CATALOGUE = "catalogue.json"
MANIFEST = "manifest.json"
PART_DIR = "_manifest"  # a stream's manifest parts; never a schema hash (those have no "_")
PART_SUFFIX = ".json.gz"
LOCK = "singerlake.lock"
NAME_FILE = "name.txt"
DATA_SUFFIX = ".singer.gz"


def tap_dir(tap_id: str) -> str:
    return f"{RAW}/{encode_segment(tap_id)}"


def catalogue_key(tap_id: str) -> str:
    return f"{tap_dir(tap_id)}/{CATALOGUE}"


@dataclass(frozen=True)
class StreamPaths:
    """Keys of one stream's objects, from its original tap id and stream name."""

    tap_id: str
    stream: str

    @property
    def tap_dir(self) -> str:
        return tap_dir(self.tap_id)

    @property
    def stream_dir(self) -> str:
        return f"{self.tap_dir}/{encode_segment(self.stream)}"

    @property
    def manifest(self) -> str:
        return f"{self.stream_dir}/{MANIFEST}"

    @property
    def catalogue(self) -> str:
        return catalogue_key(self.tap_id)

    def part(self, part_id: str) -> str:
        """An immutable manifest part (SPEC.md §5)."""
        return f"{self.stream_dir}/{PART_DIR}/{part_id}{PART_SUFFIX}"

    def schema_dir(self, schema_hash: str) -> str:
        return f"{self.stream_dir}/{schema_hash}"

    def lock(self, schema_hash: str) -> str:
        return f"{self.schema_dir(schema_hash)}/{LOCK}"

    def data_file(self, schema_hash: str, start_ms: int, end_ms: int, file_id: str) -> str:
        name = f"{encode_segment(self.stream)}-{format_ts(start_ms)}-{format_ts(end_ms)}-{file_id}"
        return check_key(f"{self.schema_dir(schema_hash)}/{name}{DATA_SUFFIX}")


@dataclass(frozen=True)
class DataFileName:
    """The parts of a data file key, parsed from the right (stream segments may contain ``-``)."""

    stream_segment: str
    schema_hash: str
    start_ms: int
    end_ms: int
    file_id: str

    @classmethod
    def parse(cls, key: str) -> DataFileName:
        parts = key.split("/")
        if len(parts) != 5 or parts[0] != RAW or not parts[4].endswith(DATA_SUFFIX):
            raise ValueError(f"{key!r} is not a data file key raw/<tap>/<stream>/<hash>/<name>{DATA_SUFFIX}")
        stem = parts[4][: -len(DATA_SUFFIX)]
        try:
            rest, file_id = stem.rsplit("-", 1)
            rest, end = rest.rsplit("-", 1)
            segment, start = rest.rsplit("-", 1)
            return cls(segment, parts[3], parse_ts(start), parse_ts(end), file_id)
        except ValueError as exc:
            raise ValueError(f"{key!r}: cannot parse <stream>-<first_ts>-<last_ts>-<id>: {exc}") from None
