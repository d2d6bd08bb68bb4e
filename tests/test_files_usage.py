"""What a user types and reads with the files commands (SPEC.md §14): fetch names that tell files apart,
labels checked and explained, times as typed, errors in the caller's terms, content types, and counts in
words. Each runs the real CLI over a local lake, as a user would (the API where it is the API's terms)."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from singerlake.errors import BadArgument
from support.files_roots import Root
from support.lakes import USERS, joined, land, local_lake_at, record_msg, schema_msg, state_msg


@pytest.fixture
def root(tmp_path) -> Root:
    return Root("local", str(tmp_path / "lake"))


def push(root: Root, path: Path, data: bytes, *args: str) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return root.cli_json("push", str(path), *args)["pushed"][0]


def singer_lake(tmp_path: Path, stream: str) -> Root:
    """A lake where the target landed one record of ``stream`` (tap ``tap-test``)."""
    (tmp_path / "singer").mkdir()
    lake = local_lake_at(tmp_path / "singer")
    land(lake.config, joined([schema_msg(stream, USERS, ["id"]), record_msg(stream, {"id": 1}), state_msg({})]))
    return Root("local", lake.config["lake_root"])


def refused(result, *named: str) -> str:
    """The one line a usage error is, exit 2, naming each of ``named``."""
    err = result.stderr.decode()
    assert result.returncode == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert all(name in err for name in named), err
    return err


# -- fetch names --------------------------------------------------------------------------------------
def test_a_name_template_giving_two_files_one_name_names_a_field_that_tells_them_apart(root, tmp_path):
    labels = ("--what", "nginx-access", "--where", "web02-prod")
    push(root, tmp_path / "a" / "web02.log", b"day one\n", *labels, "--start", "2026-11-24T08:00:00Z")
    push(root, tmp_path / "b" / "web02.log", b"day two\n", *labels, "--start", "2026-11-25T08:00:00Z")
    out = tmp_path / "by-day"
    days = ("files", "--what", "nginx-access", "--start", "2026-11-24", "--end", "2026-11-25", "--fetch", str(out))

    err = refused(root.cli(*days, "--name", "{where}/{name}", check=False), "--name", "{day}", "'{where}/{day}/{name}'")
    assert "{id}" in err and not out.exists(), "nothing fetched before the names are told apart"
    root.cli(*days, "--name", "{where}/{day}/{name}")  # the template the error suggests
    assert (out / "web02-prod/2026-11-24/web02.log").read_bytes() == b"day one\n"
    assert (out / "web02-prod/2026-11-25/web02.log").read_bytes() == b"day two\n"

    push(root, tmp_path / "c" / "web02.log", b"later that day\n", *labels, "--start", "2026-11-25T20:00:00Z")
    refused(root.cli(*days, "--name", "{where}/{day}/{name}", check=False), "{start_iso}", "'{where}/{day}/{start_iso}-{name}'")
    push(root, tmp_path / "d" / "web02.log", b"same time, other bytes\n", *labels, "--start", "2026-11-25T20:00:00Z")
    refused(root.cli(*days, "--name", "{day}/{start_iso}-{name}", check=False), "add {id}", "'{day}/{id}-{start_iso}-{name}'")


# -- labels: checked for --latest too, listed when unknown ----------------------------------------------
def test_latest_checks_its_labels_and_takes_every_what_of_a_list(root, tmp_path):
    push(root, tmp_path / "a.log", b"a\n", "--what", "app-log", "--where", "web01", "--start", "2026-11-20T10:00:00Z")
    push(root, tmp_path / "b.log", b"b\n", "--what", "nginx", "--where", "web01", "--start", "2026-11-21T10:00:00Z")
    refused(root.cli("files", "--what", "App-Log", "--latest", check=False), "--what", "App-Log")
    refused(root.cli("files", "--what", "app-log", "--where", "Web", "--latest", check=False), "--where", "Web")
    found = root.cli_json("files", "--what", "app-log, nginx", "--latest")
    assert [r["what"] for r in found] == ["app-log", "nginx"], "a space after the comma keeps the second what"
    assert [r["what"] for r in root.cli_json("files", "--what", "app-log, nginx", "--start", "2026-11-20")] == ["app-log", "nginx"]
    with pytest.raises(BadArgument, match="^what: "):
        root.lake.latest_file("App-Log")


def test_an_unknown_what_or_where_finds_nothing_and_says_which_exist(root, tmp_path):
    push(root, tmp_path / "a.log", b"a\n", "--what", "app-log", "--where", "web01", "--start", "2026-11-20T10:00:00Z")
    singer = singer_lake(tmp_path, "public.users")  # a landed stream is a what too: public.users -> public_users

    for where_from, args, hint in (
        (root, ("--what", "app-logs", "--latest"), "no what app-logs in this lake; did you mean app-log? whats: app-log"),
        (root, ("--what", "app-log", "--where", "web9", "--start", "2026-11-01"), "did you mean web01? wheres: web01"),
        (singer, ("--what", "public_user", "--latest"), "did you mean public_users?"),
        (singer, ("--what", "public_users", "--where", "tap-x", "--latest"), "wheres: tap-test"),
    ):
        result = where_from.cli("files", *args)
        err = result.stderr.decode()
        assert "(0 rows)" in result.stdout.decode() and len(err.strip().splitlines()) == 1 and hint in err, (args, err)
    quiet = root.cli("files", "--what", "app-log", "--where", "web0", "--start", "2026-11-21")  # both exist, none that day
    assert "(0 rows)" in quiet.stdout.decode() and quiet.stderr == b""


# -- times as typed -----------------------------------------------------------------------------------
def test_a_day_alone_is_the_whole_day_as_an_end_too(root, tmp_path):
    pushed = push(root, tmp_path / "a.log", b"a\n", "--what", "app-log", "--where", "web01", "--start", "2026-11-20T10:00:00Z")
    found = root.cli_json("files", "--what", "app-log", "--start", "2026-11-20", "--end", "2026-11-20")
    assert [r["id"] for r in found] == [pushed["id"]]
    assert root.cli_json("files", "--what", "app-log", "--start", "2026-11-19", "--end", "2026-11-19") == []
    day = push(root, tmp_path / "b.log", b"b\n", "--what", "app-log", "--where", "web01", "--start", "2026-11-21", "--end", "2026-11-21")
    assert (day["start_iso"], day["end_iso"]) == ("2026-11-21T00:00:00.000Z", "2026-11-21T23:59:59.999Z")
    assert [r["id"] for r in root.lake.find_files("app-log", start="2026-11-20", end="2026-11-20")] == [pushed["id"]]


def test_relative_times_yesterday_and_today(root, tmp_path):
    labels = ("--what", "app-log", "--where", "web01")
    before = int(time.time() * 1000)
    recent = push(root, tmp_path / "a.log", b"a\n", *labels, "--start", "-2h", "--end", "-30m")
    after = int(time.time() * 1000)
    assert before - 2 * 3_600_000 <= recent["start"] <= after - 2 * 3_600_000
    assert before - 1_800_000 <= recent["end"] <= after - 1_800_000
    assert [r["id"] for r in root.cli_json("files", *labels[:2], "--start", "-3h", "--end", "-1h")] == [recent["id"]]
    assert [r["id"] for r in root.cli_json("files", *labels[:2], "--start=-1d")] == [recent["id"]]
    assert root.cli_json("files", *labels[:2], "--start", "-10m") == []
    whole = push(root, tmp_path / "b.log", b"b\n", *labels, "--start", "yesterday", "--end", "Yesterday")
    days = {(datetime.now(timezone.utc) - timedelta(days=1, minutes=m)).date().isoformat() for m in (0, 5)}  # a test across midnight
    assert whole["start_iso"][:10] in days and whole["start_iso"][10:] == "T00:00:00.000Z" and whole["end_iso"][10:] == "T23:59:59.999Z"
    assert whole["end"] - whole["start"] == 86_400_000 - 1
    assert {r["id"] for r in root.cli_json("files", *labels[:2], "--start", "yesterday", "--end", "today")} == {recent["id"], whole["id"]}


def test_bad_times_say_what_is_wrong_in_the_callers_terms(root, tmp_path):
    push(root, tmp_path / "a.log", b"a\n", "--what", "app-log", "--where", "web01", "--start", "2026-11-20T10:00:00Z")
    query = ("files", "--what", "app-log")
    err = refused(root.cli(*query, "--start", "2026-11-31", check=False), "--start", "'2026-11-31' is not a valid date")
    assert "ISO 8601" not in err
    refused(root.cli(*query, "--start", "2026-11-20T25:00", check=False), "--start", "is not a valid time")
    err = refused(root.cli(*query, "--start", "2026-11-21", "--end", "2026-11-20", check=False), "--end", "2026-11-20T23:59:59.999Z")
    assert "2026-11-21T00:00:00.000Z" in err and not re.search(r"\d{13}", err), "times as ISO 8601, not ms"
    refused(root.cli(*query, "--start", "-5", check=False), "--start", "-5m")
    refused(root.cli(*query, "--work-id", "null", check=False), "--work-id:")

    lake = root.lake  # the API names its parameters, never the CLI's flags
    for call, name in (
        (lambda: lake.find_files("app-log", start="2026-11-31"), "start"),
        (lambda: lake.find_files("app-log", start="2026-11-21", end="2026-11-20"), "end"),
        (lambda: lake.find_files("app-log", work_id="null"), "work_id"),
        (lambda: lake.find_files("App-Log", start=0), "what"),
        (lambda: lake.push(tmp_path / "a.log", what="app-log", where="web 01"), "where"),
        (lambda: lake.fetch(lake.find_files("app-log", start=0), f"{tmp_path}/out/", template="{nope}"), "template"),
    ):
        with pytest.raises(BadArgument) as caught:
            call()
        assert str(caught.value).startswith(f"{name}: ") and "--" not in str(caught.value), str(caught.value)


# -- content types --------------------------------------------------------------------------------------
def test_text_files_are_stored_with_text_content_types(root, tmp_path):
    expected = {
        "report.csv": "text/csv",
        "app.log": "text/plain",
        "app.log.1": "text/plain",  # rotated
        "events.jsonl": "application/jsonl",
        "config.yaml": "application/yaml",
        "table.parquet": "application/vnd.apache.parquet",
        "report.csv.gz": "application/gzip",  # its bytes are gzip, whatever they hold
        "photo.JPG": "image/jpeg",
        "blob.weird": "application/octet-stream",
    }
    src = tmp_path / "src"
    src.mkdir()
    for name in expected:
        (src / name).write_bytes(name.encode())
    pushed = root.cli_json("push", str(src), "--what", "mixed", "--where", "web01")["pushed"]
    assert {r["name"]: r["content_type"] for r in pushed} == expected


# -- counts in words ----------------------------------------------------------------------------------
def test_counts_are_singular_for_one_and_plural_otherwise(root, tmp_path):
    (tmp_path / "a.log").write_bytes(b"a")
    text = root.cli("push", str(tmp_path / "a.log"), "--what", "app-log", "--where", "web01", "--start", "2026-11-20").stdout.decode()
    assert text.splitlines()[-1] == "1 file pushed, 0 already in the lake"
    again = root.cli("push", str(tmp_path / "a.log"), "--what", "app-log", "--where", "web01").stdout.decode()
    assert again.splitlines()[-1] == "0 files pushed, 1 already in the lake"
    listing = root.cli("ls").stdout.decode()
    assert "files app-log: 1 file, 1 byte in 1 push from web01" in listing, listing
    assert "0 files, 0 bytes would be deleted" in root.cli("vacuum").stdout.decode()

    singer = singer_lake(tmp_path, "users")
    listing = singer.cli("ls").stdout.decode()
    assert "users: 1 record in 1 file, " in listing and ", 1 commit, " in listing, listing
    assert not re.search(r"\b1 [a-z]+s\b|\(s\)", listing), listing
    assert json.loads(singer.cli("ls", "--json").stdout)["taps"]["tap-test"]["users"]["files"] == 1, "JSON keeps its numbers"
