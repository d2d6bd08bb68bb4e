"""Lakes under test and Singer messages: shared by the target and tap tests."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from singerlake.format.layout import StreamPaths
from singerlake.lake import Lake
from singerlake.storage import LocalStorage, S3Storage, Storage
from target_singerlake.target import TargetSingerlake

TAP = "tap-test"
CLI = shutil.which("target-singerlake", path=str(Path(sys.executable).parent)) or "target-singerlake"
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


# -- the lake under test -------------------------------------------------------------------------
@dataclass
class LakeUnderTest:
    """A lake root on one backend, its target config, and what a reader sees in it."""

    kind: str
    config: dict
    storage: Storage
    area: Path | None = None  # local: the directory holding the root (nothing may appear outside the root)

    def keys(self, prefix: str = "raw/") -> list[str]:
        return [info.key for info in self.storage.list(prefix)]

    def data_keys(self) -> list[str]:
        return [key for key in self.keys() if key.endswith(".singer.gz")]

    def locks(self) -> list[str]:
        return [key for key in self.keys() if key.endswith("singerlake.lock")]

    def read(self, key: str) -> bytes:
        return self.storage.read(key).data

    def json(self, key: str) -> dict:
        return json.loads(self.read(key))

    def manifest(self, stream: str, tap: str = TAP) -> dict:
        """The whole manifest as one document: the root with every part's files and activations
        (SPEC.md §5), and ``replaced``: the data files compaction took out, until vacuum."""
        manifest = Lake(self.storage).manifest(tap, stream)
        return {
            **manifest.to_dict(),
            "files": manifest.files,
            "activate_versions": manifest.activate_versions,
            "replaced": manifest.replaced_files(),
        }

    def has_manifest(self, stream: str, tap: str = TAP) -> bool:
        return self.storage.exists(StreamPaths(tap, stream).manifest)

    def file_lines(self, key: str) -> list[bytes]:
        body = gzip.decompress(self.read(key))
        assert body.endswith(b"\n"), key
        return body.split(b"\n")[:-1]

    def stored(self, stream: str, tap: str = TAP) -> list[bytes]:
        """The stream's stored RECORD lines, file by file in manifest (commit) order."""
        lines: list[bytes] = []
        for entry in self.manifest(stream, tap)["files"]:
            lines.extend(self.file_lines(entry["path"])[1:])
        return lines

    def everything(self) -> list[str]:
        """Every object the backend holds anywhere near the lake (local: the root's parent dir; S3: the bucket)."""
        if isinstance(self.storage, S3Storage):
            pages = self.storage.client.get_paginator("list_objects_v2").paginate(Bucket=self.storage.bucket)
            return [item["Key"] for page in pages for item in page.get("Contents", [])]
        return [str(path.relative_to(self.area)) for path in self.area.rglob("*") if path.is_file()]

    def root_prefix(self) -> str:
        """How ``everything()`` spells the lake root."""
        return self.storage.prefix if isinstance(self.storage, S3Storage) else "lake/"


def local_lake_at(tmp_path: Path) -> LakeUnderTest:
    area = tmp_path / "area"
    area.mkdir()
    return LakeUnderTest("local", {"lake_root": str(area / "lake"), "tap_id": TAP}, LocalStorage(area / "lake"), area)


def s3_lake_at(s3_root) -> LakeUnderTest:
    url, options = s3_root
    config = {
        "lake_root": url,
        "tap_id": TAP,
        "s3_endpoint_url": options["endpoint_url"],
        "s3_access_key_id": options["access_key_id"],
        "s3_secret_access_key": options["secret_access_key"],
        "s3_region": options["region"],
    }
    return LakeUnderTest("s3", config, S3Storage(url, **options))


# -- messages ------------------------------------------------------------------------------------
def schema_msg(stream: str, schema: dict, keys: list[str] | None = None) -> bytes:
    return json.dumps({"type": "SCHEMA", "stream": stream, "schema": schema, "key_properties": keys or []}).encode()


def record_msg(stream: str, record: dict | str, time_extracted: str | None = None) -> bytes:
    body = record if isinstance(record, str) else json.dumps(record, ensure_ascii=False)
    line = '{"type":"RECORD","stream":' + json.dumps(stream, ensure_ascii=False) + ',"record":' + body
    if time_extracted is not None:
        line += ',"time_extracted":"' + time_extracted + '"'
    return (line + "}").encode("utf-8")


def state_msg(value: dict | str) -> bytes:
    body = value if isinstance(value, str) else json.dumps(value)
    return b'{"type":"STATE","value":' + body.encode() + b"}"


def joined(lines: list[bytes], final_newline: bool = True) -> bytes:
    return b"\n".join(lines) + (b"\n" if final_newline else b"")


def ms(text: str) -> int:
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (dt - EPOCH) // timedelta(milliseconds=1)


def name_ts(millis: int) -> str:
    dt = EPOCH + timedelta(milliseconds=millis)
    return dt.strftime("%Y%m%dT%H%M%S.") + f"{millis % 1000:03d}Z"


USERS = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": ["string", "null"]}}}
ORDERS = {"type": "object", "properties": {"order": {"type": "string"}, "total": {"type": "number"}}}


# -- running the target --------------------------------------------------------------------------
NOTES = {"type": "object", "properties": {"id": {"type": "integer"}, "note": {"type": "string"}}}


def notes_landing(streams: list[str], first_id: int = 0, records: int = 5) -> bytes:
    """A SCHEMA per stream, ``records`` records each (ids from ``first_id``), then one STATE: one batch of many streams."""
    lines = [schema_msg(stream, NOTES, ["id"]) for stream in streams]
    for stream in streams:
        lines += [
            record_msg(stream, {"id": i, "note": f"{stream} {i}"}, "2026-11-29T10:00:00.000Z") for i in range(first_id, first_id + records)
        ]
    return joined([*lines, state_msg({"done": first_id})])


def land(config: dict, data: bytes, **settings) -> list[str]:
    """Run the target in-process on ``data``; returns the STATE lines it wrote to stdout."""
    target = TargetSingerlake(config={**config, **settings})
    out = io.StringIO()
    with redirect_stdout(out):
        target.listen(file_input=io.BytesIO(data))
    return [line for line in out.getvalue().splitlines() if line.strip()]


def land_failing(config: dict, data: bytes, **settings) -> tuple[BaseException, list[str]]:
    target = TargetSingerlake(config={**config, **settings})
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(Exception) as info:
        target.listen(file_input=io.BytesIO(data))
    return info.value, [line for line in out.getvalue().splitlines() if line.strip()]


def run_cli(config: dict, data: bytes, tmp_path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(config))
    environment = {key: value for key, value in os.environ.items() if key != "MELTANO_EXTRACTOR_NAME"}
    environment.update({"AWS_EC2_METADATA_DISABLED": "true", **(env or {})})
    return subprocess.run([CLI, "--config", str(config_file)], input=data, capture_output=True, timeout=300, env=environment)


def duckdb_for(lake: LakeUnderTest, reader: str, needs: tuple[str, ...] = ()):
    """DuckDB with its ``reader`` extension (``delta``, ``iceberg``) and ``needs`` loaded from their PyPI
    wheels (DuckDB downloads them otherwise), and httpfs with the lake's S3 server as a secret."""
    import glob

    import duckdb

    wheels = glob.glob(f"{os.path.dirname(duckdb.__file__)}/../duckdb_ext/extensions/v*/*/*")
    found = {os.path.basename(path).split(".")[0]: path for path in wheels}
    if reader not in found:
        pytest.skip(f"no {reader} extension for DuckDB {duckdb.__version__} (pip install duckdb-ext-{reader} of the same version)")
    connection = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    for name in ("httpfs", *needs, reader):
        connection.execute(f"LOAD '{found[name]}'")
    if isinstance(lake.storage, S3Storage):
        options = lake.storage.open_options()
        endpoint = options["endpoint_url"].removeprefix("http://")
        connection.execute(
            f"CREATE SECRET lake (TYPE s3, KEY_ID '{options['access_key_id']}', SECRET '{options['secret_access_key']}', "
            f"REGION '{options['region']}', ENDPOINT '{endpoint}', URL_STYLE 'path', USE_SSL false)"
        )
    return connection
