"""tap-singerlake in the tests: run in-process or as the command, the messages it emits, and the sample input
the target lands for it (two streams, a schema change, edge values, STATE messages)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

from tap_singerlake.tap import TapSingerlake

from support.lakes import LakeUnderTest, joined, record_msg, schema_msg, state_msg

TAP_CLI = shutil.which("tap-singerlake", path=str(Path(sys.executable).parent)) or "tap-singerlake"

USERS_V1 = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": ["string", "null"]}}}
USERS_V2 = {"type": "object", "properties": {"id": {"type": "integer"}, "email": {"type": "string"}}}
ORDERS = {"type": "object", "properties": {"order": {"type": "integer"}, "total": {"type": "number"}}}
EDGE_RECORDS = [
    '{"id": 123456789012345678901234567890, "name": "ünïcødé ✓ 😀"}',
    '{"id":2,"name":null}',
    '{"id": 3, "name": "a\\"quoted\\" \\\\ \\u00e9"}',
]


# -- running the tap -----------------------------------------------------------------------------
def tap_config(lake: LakeUnderTest, **settings) -> dict:
    return {**lake.config, **settings}


def replay(config: dict, state: dict | None = None, catalog: dict | None = None) -> list[bytes]:
    """Run the tap in-process; returns its stdout lines as bytes."""
    tap = TapSingerlake(config=config, state=state, catalog=catalog)
    buffer = io.BytesIO()
    text = io.TextIOWrapper(buffer, encoding="utf-8", write_through=True)
    with redirect_stdout(text):
        tap.sync_all()
        text.flush()
    return buffer.getvalue().splitlines()


def run_tap(config: dict, tmp_path: Path, *args: str, state: dict | None = None) -> subprocess.CompletedProcess:
    config_file = tmp_path / "tap-config.json"
    config_file.write_text(json.dumps(config))
    command = [TAP_CLI, "--config", str(config_file), *args]
    if state is not None:
        state_file = tmp_path / "tap-state.json"
        state_file.write_text(json.dumps(state))
        command += ["--state", str(state_file)]
    return subprocess.run(command, capture_output=True, timeout=120)


def of_type(lines: list[bytes], kind: str, stream: str | None = None) -> list[bytes]:
    found = []
    for line in lines:
        message = json.loads(line)
        if message["type"] == kind and (stream is None or message.get("stream") == stream):
            found.append(line)
    return found


def last_state(lines: list[bytes]) -> dict:
    return json.loads(of_type(lines, "STATE")[-1])["value"]


def sent_records(data: bytes, stream: str) -> list[bytes]:
    return of_type([line for line in data.splitlines() if line.strip()], "RECORD", stream)


def schema_in_force(lines: list[bytes]) -> list[tuple[str, dict]]:
    """For each RECORD, in order: its stream and the last SCHEMA of that stream before it."""
    current: dict[str, dict] = {}
    out = []
    for line in lines:
        message = json.loads(line)
        if message["type"] == "SCHEMA":
            current[message["stream"]] = {"schema": message["schema"], "key_properties": message.get("key_properties")}
        elif message["type"] == "RECORD":
            out.append((message["stream"], current[message["stream"]]))
    return out


# -- sample input ----------------------------------------------------------------------------------
def sample_input() -> bytes:
    """Two interleaved streams, a schema change, edge values, STATE messages."""
    lines = [schema_msg("users", USERS_V1, ["id"]), schema_msg("public.orders", ORDERS, ["order"])]
    lines += [record_msg("users", text) for text in EDGE_RECORDS]
    for index in range(40):
        lines.append(record_msg("users", {"id": 100 + index, "name": f"user {index}"}, f"2024-01-01T00:{index:02d}:00.000Z"))
        lines.append(f'{{"type":"RECORD","stream":"public.orders","record":{{"order":{index},"total":1.10000000000000000001}}}}'.encode())
    lines.append(state_msg({"bookmarks": {"users": {"n": 1}}}))
    lines.append(schema_msg("users", USERS_V2, ["id"]))
    lines += [record_msg("users", {"id": 200 + index, "email": f"u{index}@example.com"}) for index in range(15)]
    lines.append(state_msg({"bookmarks": {"users": {"n": 2}}}))
    return joined(lines)
