"""target-singerlake under the singer-sdk standard target test suite, plus checks of what it stored.

The SDK suite runs the target in-process (real Spark local mode, one shared session) on the SDK's
``target_test_streams`` files. The custom checks below run the same files and compare the lake's
stored RECORD lines with the input's, byte for byte, per stream.
"""

from __future__ import annotations

import gzip
import importlib.resources
import io
import json
import shutil
import tempfile
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from singer_sdk.testing import get_target_test_class, target_test_streams
from singerlake import Lake
from singerlake.format.schema_hash import schema_hash
from target_singerlake.target import TargetSingerlake

SUITE_ROOT = Path(tempfile.mkdtemp(prefix="singerlake-sdk-suite-")) / "lake"
SUITE_CONFIG = {"lake_root": str(SUITE_ROOT), "tap_id": "sdk-suite"}

TestTargetSingerlakeSDK = get_target_test_class(TargetSingerlake, config=SUITE_CONFIG)


@pytest.fixture(scope="module", autouse=True)
def _remove_suite_root():
    yield
    shutil.rmtree(SUITE_ROOT.parent, ignore_errors=True)


STREAMS_DIR = importlib.resources.files(target_test_streams)
# Files the SDK suite expects the target to reject.
REJECTED = {"invalid_schema", "record_before_schema", "record_missing_key_property"}
ACCEPTED = sorted(p.name[: -len(".singer")] for p in STREAMS_DIR.iterdir() if p.name.endswith(".singer") and p.name[:-7] not in REJECTED)


def _input_records(data: bytes) -> dict[str, list[bytes]]:
    """Per stream, the input's RECORD lines exactly as sent (without the line terminator)."""
    streams: dict[str, list[bytes]] = {}
    for line in data.splitlines():
        if not line.strip():
            continue
        message = json.loads(line)
        if message["type"] == "RECORD":
            streams.setdefault(message["stream"], []).append(line)
    return streams


def _input_schemas(data: bytes) -> dict[str, list[dict]]:
    schemas: dict[str, list[dict]] = {}
    for line in data.splitlines():
        message = json.loads(line) if line.strip() else {}
        if message.get("type") == "SCHEMA":
            schemas.setdefault(message["stream"], []).append(message)
    return schemas


def _stored_records(root: Path, tap_id: str) -> dict[str, list[bytes]]:
    """Per stream, the RECORD lines of the lake's committed files, in commit order."""
    lake = Lake.open(str(root))
    stored: dict[str, list[bytes]] = {}
    for stream in lake.streams(tap_id):
        manifest = lake.manifest(tap_id, stream)
        lines: list[bytes] = []
        for entry in manifest.files:
            data = (root / entry["path"]).read_bytes()
            body = gzip.decompress(data)
            assert body.endswith(b"\n"), entry["path"]
            file_lines = body.split(b"\n")[:-1]
            assert json.loads(file_lines[0])["type"] == "SCHEMA"
            assert len(file_lines) - 1 == entry["records"]
            lines.extend(file_lines[1:])
        stored[stream] = lines
    return stored


@pytest.mark.parametrize("name", ACCEPTED)
def test_sdk_stream_file_is_stored_byte_for_byte(name, tmp_path):
    data = (STREAMS_DIR / f"{name}.singer").read_bytes()
    root = tmp_path / "lake"
    target = TargetSingerlake(config={"lake_root": str(root), "tap_id": "sdk-suite"})
    out = io.StringIO()
    with redirect_stdout(out):
        target.listen(file_input=io.BytesIO(data))
    expected = _input_records(data)
    assert _stored_records(root, "sdk-suite") == expected
    # Every stream that got records has its latest SCHEMA in the catalogue, hashed as the spec says.
    catalogue = Lake.open(str(root)).catalogue("sdk-suite")
    by_stream = {entry["tap_stream_id"]: entry for entry in catalogue["streams"]}
    for stream in expected:
        last = _input_schemas(data)[stream][-1]
        entry = by_stream[stream]
        assert entry["schema"] == last["schema"]
        keys = last.get("key_properties") or []
        assert entry["metadata"][0]["metadata"]["singerlake-schema-hash"] == schema_hash(last["schema"], keys)
    # The last STATE received is the last one emitted.
    states = [json.loads(line)["value"] for line in data.splitlines() if line.strip() and json.loads(line)["type"] == "STATE"]
    emitted = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    if states:
        assert emitted and emitted[-1] == states[-1]
    else:
        assert emitted == []
