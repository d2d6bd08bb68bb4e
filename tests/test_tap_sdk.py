"""tap-singerlake under the singer-sdk standard tap test suite, over a fixture lake of what the target lands.

The SDK factory reads the tap's streams when the test class is created, so the suite's lake exists when
this module is imported: written there with the core's SchemaWriter, which starts no Spark (nothing may
start Spark at import time). A fixture lands the same input with the target (in-process, real Spark)
and a test checks both lakes replay alike, and as the input: the suite reads what the target lands.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from singer_sdk.testing import get_tap_test_class
from singerlake import Lake, SchemaWriter
from singerlake.times import parse_time_ms
from support.lakes import joined, land, record_msg, schema_msg
from support.taps import of_type, replay
from tap_singerlake.tap import TapSingerlake

SUITE_AREA = Path(tempfile.mkdtemp(prefix="singerlake-tap-suite-"))
SUITE_CONFIG = {"lake_root": str(SUITE_AREA / "lake"), "tap_id": "tap-fixture"}

USERS = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "active": {"type": "boolean"},
        "score": {"type": "number"},
        "created_at": {"type": "string", "format": "date-time"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}},
        "nickname": {"type": ["string", "null"]},
    },
}
ORDERS = {"type": "object", "properties": {"order_id": {"type": "integer"}, "user_id": {"type": "integer"}, "total": {"type": "number"}}}


def _fixture_input() -> bytes:
    lines = [schema_msg("users", USERS, ["id"]), schema_msg("orders", ORDERS, ["order_id"])]
    for n in range(25):
        user = {
            "id": n,
            "name": f"user {n}",
            "active": n % 2 == 0,
            "score": n * 1.5,
            "created_at": f"2024-02-{1 + n:02d}T12:00:00.000Z",
            "tags": ["a", f"t{n}"],
            "address": {"city": "Lyon"},
            "nickname": None if n % 3 else f"nick{n}",
        }
        lines.append(record_msg("users", user, f"2024-02-{1 + n:02d}T12:00:00.000Z"))
        lines.append(record_msg("orders", {"order_id": 1000 + n, "user_id": n, "total": 9.99}))
    return joined(lines)


def _time_ms(line: bytes) -> int:
    """The time the target gives a record: its time_extracted, else a fixed receipt time."""
    extracted = json.loads(line).get("time_extracted")
    return parse_time_ms(extracted) if extracted else parse_time_ms("2024-03-01T00:00:00Z")


def _write_suite_lake(config: dict, data: bytes, file_records: int) -> None:
    """``data`` as a lake, each stream in files of ``file_records`` records, committed as a landing commits them."""
    lake = Lake.open(config["lake_root"])
    lines = [line for line in data.splitlines() if line.strip()]
    for schema_line in of_type(lines, "SCHEMA"):
        message = json.loads(schema_line)
        records = of_type(lines, "RECORD", message["stream"])
        with SchemaWriter(lake, config["tap_id"], message, schema_line=schema_line) as writer:
            for first in range(0, len(records), file_records):
                chunk = records[first : first + file_records]
                writer.commit([writer.write_file(chunk, [_time_ms(line) for line in chunk])])


FIXTURE_INPUT = _fixture_input()
_write_suite_lake(SUITE_CONFIG, FIXTURE_INPUT, file_records=10)

TestTapSingerlakeSDK = get_tap_test_class(TapSingerlake, config=SUITE_CONFIG)


@pytest.fixture(scope="module", autouse=True)
def _remove_suite_lake():
    yield
    shutil.rmtree(SUITE_AREA, ignore_errors=True)


@pytest.fixture(scope="module")
def landed_config(tmp_path_factory) -> dict:
    """The fixture input landed by the target (in-process; the test process's Spark), in batches of 10 records."""
    config = {"lake_root": str(tmp_path_factory.mktemp("target-landed") / "lake"), "tap_id": SUITE_CONFIG["tap_id"]}
    land(config, FIXTURE_INPUT, batch_max_rows=10)
    return config


def test_the_suite_lake_replays_the_fixture_input_exactly_as_the_lake_the_target_lands(landed_config):
    """The SDK tests above read the suite's lake: it holds exactly the input, and replays as the target's lake does."""
    out = replay(SUITE_CONFIG)
    sent = FIXTURE_INPUT.splitlines()
    for stream in ("users", "orders"):
        assert of_type(out, "RECORD", stream) == of_type(sent, "RECORD", stream)
    assert [json.loads(line)["stream"] for line in of_type(out, "SCHEMA")] == ["orders", "users"]
    landed = replay(landed_config)
    assert [line for line in landed if json.loads(line)["type"] != "STATE"] == [line for line in out if json.loads(line)["type"] != "STATE"]
