"""The files queries over landed Singer data (SPEC.md §14): where = the tap, what = the stream, and the
target's work_id, so "which files of a stream cover a day" and "what did this run land" are one query."""

from __future__ import annotations

import json
import subprocess
import sys

from singerlake.lake import Lake
from support.lakes import USERS, joined, land, local_lake_at, record_msg, run_cli, schema_msg, state_msg

WHAT = "public_users"  # the stream public.users, normalised as every data file's metadata record has it


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "singerlake.cli", *args], capture_output=True, text=True, timeout=120)


def _day(stream: str, day: str, ids: range) -> list[bytes]:
    return [record_msg(stream, {"id": n, "name": f"u{n}"}, f"{day}T{10 + n % 10:02d}:00:00Z") for n in ids]


def test_a_day_query_finds_the_data_files_of_a_stream_covering_it_and_fetches_their_bytes(tmp_path):
    lake = local_lake_at(tmp_path)
    for day, ids in (("2024-03-02", range(0, 5)), ("2024-03-03", range(5, 10)), ("2024-03-04", range(10, 15))):
        land(lake.config, joined([schema_msg("public.users", USERS, ["id"]), *_day("public.users", day, ids), state_msg({"d": day})]))
    root = lake.config["lake_root"]

    found = _run("files", root, "--what", WHAT, "--start", "2024-03-03", "--end", "2024-03-03T23:59:59Z", "--json")
    assert found.returncode == 0, found.stderr
    records = json.loads(found.stdout)
    assert [r["start_iso"][:10] for r in records] == ["2024-03-03"]
    assert records[0]["where"] == "tap-test" and records[0]["stream"] == "public.users"

    out = tmp_path / "fetched"
    every_day = ("--start", "2024-03-02", "--end", "2024-03-04T23:00:00Z")
    fetched = _run("files", root, "--what", WHAT, "--where", "tap-", *every_day, "--fetch", str(out))
    assert fetched.returncode == 0, fetched.stderr
    got = sorted(p.name for p in out.iterdir())
    assert len(got) == 3
    for record in json.loads(_run("files", root, "--what", WHAT, "--start", "2024-03-02", "--json").stdout):
        assert (out / f"{record['id']}-{record['name']}").read_bytes() == lake.read(record["key"])

    nothing = _run("files", root, "--what", WHAT, "--where", "tap-other", "--start", "2024-03-02", "--json")
    assert json.loads(nothing.stdout) == []


def test_the_targets_work_id_is_on_every_file_of_its_run_and_one_query_lists_them(tmp_path):
    lake = local_lake_at(tmp_path)
    first = joined([schema_msg("public.users", USERS, ["id"]), *_day("public.users", "2024-03-03", range(3)), state_msg({"a": 1})])
    second = joined([schema_msg("public.users", USERS, ["id"]), *_day("public.users", "2024-03-03", range(3, 9)), state_msg({"a": 2})])
    land(lake.config, first, work_id="nightly-2024-03-03")
    done = run_cli(lake.config, second, tmp_path, env={"MELTANO_RUN_ID": "6F2A31C4-0000-4000-8000-00000000000A"})
    assert done.returncode == 0, done.stderr.decode()
    run_id = "6f2a31c4-0000-4000-8000-00000000000a"  # Meltano's run id, lower-cased: a valid work id
    assert f"work_id {run_id}: what this run landed: singerlake files" in done.stderr.decode()

    api = Lake.open(lake.config["lake_root"])
    by_setting = api.find_files(WHAT, work_id="nightly-2024-03-03")
    by_run = api.find_files(WHAT, work_id=run_id)
    assert sum(r["records"] for r in by_setting) == 3 and sum(r["records"] for r in by_run) == 6
    assert {r["work_id"] for r in by_setting + by_run} == {"nightly-2024-03-03", run_id}
    cli = _run("files", lake.config["lake_root"], "--what", WHAT, "--work-id", run_id, "--json")
    assert [r["id"] for r in json.loads(cli.stdout)] == [r["id"] for r in by_run]


def test_a_bad_work_id_setting_is_one_line_and_exit_2_before_anything_lands(tmp_path):
    lake = local_lake_at(tmp_path)
    data = joined([schema_msg("public.users", USERS, ["id"]), *_day("public.users", "2024-03-03", range(3))])
    for bad in ("null", "Nightly Run"):
        done = run_cli({**lake.config, "work_id": bad}, data, tmp_path)
        errors = [line for line in done.stderr.decode().splitlines() if "error" in line.lower()]
        assert done.returncode == 2 and len(errors) == 1 and "setting 'work_id'" in errors[0], done.stderr.decode()
    assert lake.keys() == []


def test_latest_takes_the_newest_of_pushed_files_and_landed_data(tmp_path):
    lake = local_lake_at(tmp_path)
    land(lake.config, joined([schema_msg("public.users", USERS, ["id"]), *_day("public.users", "2024-03-03", range(3))]))
    api = Lake.open(lake.config["lake_root"])
    assert api.latest_file(WHAT)["start_iso"].startswith("2024-03-03")
    extra = tmp_path / "users-export.csv"
    extra.write_text("id\n1\n")
    api.push(extra, what=WHAT, where="exports", start="2024-03-05T00:00:00Z")
    assert api.latest_file(WHAT)["name"] == "users-export.csv"
    assert api.latest_file(WHAT, where="tap")["where"] == "tap-test"
