"""tap-singerlake under the singer-sdk standard tap test suite, over a fixture lake the target builds.

The SDK factory reads the tap's streams when the test class is created, so the fixture lake is
landed (in-process target, real Spark) when this module is imported.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from singer_sdk.testing import get_tap_test_class
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


FIXTURE_INPUT = _fixture_input()
land(SUITE_CONFIG, FIXTURE_INPUT, batch_max_rows=10)

TestTapSingerlakeSDK = get_tap_test_class(TapSingerlake, config=SUITE_CONFIG)


@pytest.fixture(scope="module", autouse=True)
def _remove_suite_lake():
    yield
    shutil.rmtree(SUITE_AREA, ignore_errors=True)


def test_the_suite_lake_replays_the_fixture_input_exactly():
    """The SDK tests above read this lake; this checks it holds exactly what was landed."""
    out = replay(SUITE_CONFIG)
    sent = FIXTURE_INPUT.splitlines()
    for stream in ("users", "orders"):
        assert of_type(out, "RECORD", stream) == of_type(sent, "RECORD", stream)
    assert [json.loads(line)["stream"] for line in of_type(out, "SCHEMA")] == ["orders", "users"]
