"""target-singerlake on what a newcomer meets (issue #16): records at the epoch, Ctrl-C once and
twice, and a running total while a long batch is being read."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import threading
import time
from pathlib import Path

from singerlake import Lake
from singerlake.landing.lander import Lander, LandingSettings
from support.lakes import CLI, TAP, USERS, joined, land, record_msg, schema_msg, state_msg

HANG_S = 300  # hang detector, not a speed limit


def test_a_record_extracted_at_the_epoch_is_filed_under_the_epoch(local_lake):
    data = joined([schema_msg("users", USERS, ["id"]), record_msg("users", {"id": 1, "_sdc_extracted_at": "1970-01-01T00:00:00Z"})])
    land(local_lake.config, data)
    [entry] = local_lake.manifest("users")["files"]
    assert (entry["start"], entry["end"]) == (0, 0)  # as tap-singerlake's window reads it, not the receive time


class Interrupted:
    """A target reading from a pipe that stays open, so only Ctrl-C (SIGINT) ends it."""

    def __init__(self, tmp_path: Path, **settings):
        self.root = tmp_path / "lake"
        config = tmp_path / "config.json"
        config.write_text(json.dumps({"lake_root": str(self.root), "tap_id": TAP, **settings}))
        self.proc = subprocess.Popen([CLI, "--config", str(config)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[bytes] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    def send(self, *lines: bytes) -> None:
        self.proc.stdin.write(joined(list(lines)))
        self.proc.stdin.flush()

    def wait_for(self, check, what: str) -> None:
        deadline = time.monotonic() + HANG_S
        while not check():
            assert self.proc.poll() is None, f"target ended before {what}: {self.proc.stderr.read().decode()[-3000:]}"
            assert time.monotonic() < deadline, f"no {what} after {HANG_S}s"
            time.sleep(0.05)

    def end(self) -> tuple[int, str]:
        code = self.proc.wait(timeout=HANG_S)
        self._reader.join(timeout=HANG_S)
        stderr = self.proc.stderr.read().decode()
        self.proc.stdin.close()
        return code, stderr

    def locks(self) -> list[Path]:
        return list(self.root.rglob("singerlake.lock"))


def test_ctrl_c_commits_what_was_received_and_exits_130(tmp_path):
    run = Interrupted(tmp_path, max_batch_age_seconds=0.5)
    run.send(schema_msg("users", USERS, ["id"]), *(record_msg("users", {"id": n}) for n in range(3)), state_msg({"n": 3}))
    run.wait_for(lambda: any(b'"n": 3' in line for line in run.lines), "STATE after the first records")
    run.send(*(record_msg("users", {"id": n}) for n in range(3, 5)), state_msg({"n": 5}))
    time.sleep(1)  # read by now (the pipe is tiny); they commit on the way out
    run.proc.send_signal(signal.SIGINT)
    code, stderr = run.end()
    assert code == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "Ctrl-C again" in stderr
    assert json.loads(run.lines[-1]) == {"n": 5}  # its STATE printed: what was received is committed
    manifest = Lake.open(str(run.root)).manifest(TAP, "users")
    assert sum(entry["records"] for entry in manifest.files) == 5
    assert not run.locks()


def test_a_second_ctrl_c_stops_without_committing(tmp_path):
    # spark_conf: Spark starts at once and the batch waits for it (a run whose input ended before Spark began
    # to start would be written by the driver at once, before the second Ctrl-C could arrive)
    run = Interrupted(tmp_path, spark_conf={"spark.ui.enabled": "false"})
    run.send(schema_msg("users", USERS, ["id"]), *(record_msg("users", {"id": n}) for n in range(1000)), state_msg({"n": 1000}))
    run.wait_for(lambda: run.locks(), "writer's lock (the records were read)")
    run.proc.send_signal(signal.SIGINT)  # commit what was received ...
    time.sleep(0.2)
    run.proc.send_signal(signal.SIGINT)  # ... no: stop now
    code, stderr = run.end()
    assert code == 130, stderr[-3000:]
    assert "target-singerlake: error: interrupted: stopped without committing" in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert not run.lines  # no STATE: nothing it covers was committed
    manifest = Lake.open(str(run.root)).manifest(TAP, "users")
    assert not manifest.files


def test_a_long_batch_logs_its_running_total_while_it_is_read(local_lake, caplog):
    lake = Lake.open(local_lake.config["lake_root"])
    lake.storage.check_writable()
    settings = LandingSettings(tap_id=TAP, progress_interval_s=0.2, max_batch_age_s=3600)
    lander = Lander(lake, settings, spark=lambda: None, emit_state=lambda state: None)

    def slow_tap():
        yield schema_msg("users", USERS, ["id"])
        for n in range(30):
            yield record_msg("users", {"id": n})
            time.sleep(0.05)

    with caplog.at_level(logging.INFO, logger="singerlake.landing"):
        try:
            lander.feed(slow_tap())
        finally:
            lander.abort()  # nothing committed: this is about what is logged while reading
    totals = [record.getMessage() for record in caplog.records if "records received so far" in record.getMessage()]
    assert len(totals) >= 2, caplog.text
    assert "of them in the batch being filled" in totals[-1]


def test_schema_validity_checked_column_by_column_agrees_with_the_meta_schema():
    """The target checks each SCHEMA against draft 7 column by column, remembering each column's
    verdict (taps repeat column schemas); that must be exactly the meta-schema's verdict."""
    from jsonschema import Draft7Validator
    from singerlake.landing.lander import _is_valid_schema

    meta = Draft7Validator(Draft7Validator.META_SCHEMA)
    schemas = [
        USERS,
        {"type": "object", "properties": {"id": {"type": "integer"}}},
        {"type": "objekt", "properties": {"id": {"type": "integer"}}},
        {"type": "object", "properties": {"id": {"type": "integr"}}},
        {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": 5}}}}},
        {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": ["string", "null"]}}}}},
        {"type": "object", "properties": {"a": True, "b": False}},
        {"type": "object", "properties": {"a": 3}},
        {"type": "object", "properties": []},
        {"type": "object", "properties": {}, "required": "id"},
        {"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "nul"}]}}},
        {"type": "object", "properties": {"x": {"minimum": "1"}}},
        {"type": "object", "properties": {"x": {"minimum": 1}}, "additionalProperties": {"type": "bogus"}},
        {"type": "object", "properties": {"x": {"minimum": 1}}, "additionalProperties": {"type": "string"}},
        {"type": "object", "properties": {"x": {"type": "array", "items": {"type": "object", "properties": {"y": {"enum": []}}}}}},
    ]
    for _ in range(2):  # the second time every verdict comes from what was remembered
        assert [_is_valid_schema(schema) for schema in schemas] == [meta.is_valid(schema) for schema in schemas]
