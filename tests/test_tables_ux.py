"""A user's tables (issue #38, frictions 3, 6, 7, 8), over the real CLI: JSON-text columns are shown with why and
a chosen type (`--type`) makes the first natural query work; a format asked for later is written for the whole
table; project names each Iceberg table and its metadata location; the docs site shows the published tables and
where a tap's annotations come from."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from deltalake import DeltaTable
from support.cli_session import CliSession
from support.lake_cli import LakeCli, cli_env
from support.lakes import TAP, LakeUnderTest, joined, land, record_msg, schema_msg

SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"}, "score": {"type": ["number", "null"]}},
}
USERS = [{"id": 1, "name": "ada", "score": 3.7}, {"id": 2, "name": "bob", "score": 9}, {"id": 3, "name": "cy", "score": 7.25}]
HUGE = '{"id": 4, "name": "dee", "score": 1.5e+300}'  # not a decimal(38): the whole column is JSON text
WHY = "a value fits no decimal(38)"


def land_users(lake: LakeUnderTest, stream: str = "users") -> None:
    records = [record_msg(stream, user) for user in USERS] + [record_msg(stream, HUGE)]
    land(lake.config, joined([schema_msg(stream, SCHEMA, ["id"]), *records]))


def ok(done):
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def one_error(done, code: int = 2) -> str:
    assert done.returncode == code, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("singerlake ") and ("error" in line or "failed" in line)]
    assert lines and not any(line.startswith("Traceback") for line in done.stderr.splitlines()), done.stderr  # Spark's own log aside
    return lines[0]


# -- friction 3: JSON text shown, and a chosen type ---------------------------------------------------
def test_json_text_columns_are_marked_and_a_chosen_type_makes_the_first_query_work(local_lake, cli_session):
    cli = cli_session(local_lake)
    land_users(local_lake)
    ok(cli.run("project"))
    query = "SELECT name, score FROM users WHERE score > 5 ORDER BY name"
    assert "CAST_INVALID_INPUT" in one_error(cli.run("sql", query))  # exact types: the user is told why below

    described = ok(cli.session.run("sql", local_lake.config["lake_root"], "--spark-master", "local[2]", input="\\d users\n"))
    [score] = [line for line in described.stdout.splitlines() if line.startswith("score")]
    assert "string" in score and f"JSON text: {WHY}" in score, described.stdout
    listed = ok(cli.run("ls"))
    assert f"score: string (JSON text: {WHY}" in listed.stdout and "version 0, 4 rows" in listed.stdout, listed.stdout
    [column] = [c for c in json.loads(ok(cli.run("ls", "--json")).stdout)["taps"][TAP]["users"]["table"]["columns"] if c["name"] == "score"]
    assert column["type"] == "string" and WHY in column["json_text"]

    chosen = ok(cli.run("sql", query, "--type", "users.score=double", "--json"))
    assert json.loads(chosen.stdout) == [{"name": "bob", "score": 9.0}, {"name": "cy", "score": 7.25}, {"name": "dee", "score": 1.5e300}]

    ok(cli.run("project", "--type", "users.score=double"))  # a choice given: every file rewritten, in one commit
    table = DeltaTable(str(Path(local_lake.config["lake_root"]) / "published" / TAP / "users"))
    assert table.version() == 1 and str(table.to_pyarrow_table().schema.field("score").type) == "double"
    rows = json.loads(ok(cli.run("sql", query, "--json")).stdout)
    assert [row["name"] for row in rows] == ["bob", "cy", "dee"]
    assert "score: double (chosen with --type)" in ok(cli.run("ls")).stdout
    ok(cli.run("project", "--type", "users.score=double"))
    assert DeltaTable(table.table_uri).version() == 1  # the same choice again: nothing to do

    for bad, named in (
        ("users.nope=double", "no column 'nope'"),
        ("users.score=float", "unknown type 'float'"),
        ("nobody.score=double", "no stream 'nobody'"),
        ("users.score", "expected STREAM.COLUMN=TYPE"),
    ):
        for command in ("project", "sql"):
            error = one_error(cli.run(command, *([query] if command == "sql" else []), "--type", bad))
            assert named in error, (command, bad, error)

    failed = cli.run("project", "--type", "users.name=double")  # "ada" is no number: the stream fails, naming it
    line = one_error(failed, code=1)
    assert "users" in line and "'name'" in line and '"ada"' in line and "commit 1, record 0" in line, failed.stderr
    assert DeltaTable(table.table_uri).version() == 1  # the table stays at its last version
    wrong = one_error(cli.run("sql", query, "--type", "users.name=long"))
    assert "'name'" in wrong and '"ada"' in wrong and "not a long" in wrong, wrong


# -- friction 6: a format asked for later -------------------------------------------------------------
def test_csv_asked_after_a_delta_only_run_is_written_for_the_whole_table(local_lake, cli_session):
    cli = cli_session(local_lake)
    land_users(local_lake)
    ok(cli.run("project"))
    done = json.loads(ok(cli.run("project", "--formats", "delta,csv", "--json")).stdout)
    [stream] = done["streams"]
    assert stream["new_records"] == 0 and len(stream["csv"]) == 1, stream
    text = (Path(local_lake.config["lake_root"]) / stream["csv"][0]).read_text()
    assert text.splitlines()[0] == '"id","name","score"' and len(text.splitlines()) == 5, text
    again = json.loads(ok(cli.run("project", "--formats", "delta,csv", "--json")).stdout)["streams"]
    assert again == []  # asked as the last run was, with nothing new: no stream visited
    [again] = json.loads(ok(cli.run("project", "--formats", "delta,csv", "--tap", TAP, "--stream", "users", "--json")).stdout)["streams"]
    assert again["csv"] == stream["csv"] and again["version"] == stream["version"]  # every twin there: nothing to do


# -- friction 7: Iceberg tables named, with their metadata location ----------------------------------
@pytest.fixture
def catalog_env(tmp_path, monkeypatch) -> str:
    pytest.importorskip("pyiceberg")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", f"sqlite:///{tmp_path}/catalog.db")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__WAREHOUSE", f"file://{tmp_path}/warehouse")
    return "lake"


def test_project_names_each_iceberg_table_and_its_metadata_location(local_lake, catalog_env):
    from pyiceberg.table import StaticTable

    land_users(local_lake, "public-things")
    with CliSession(cli_env()) as session:
        cli = LakeCli(session, local_lake, "local[2]")
        iceberg = ["--formats", "delta,iceberg", "--iceberg-catalog", "lake"]
        [stream] = json.loads(ok(cli.run("project", *iceberg, "--json")).stdout)["streams"]
        named = stream["iceberg"]
        assert (named["namespace"], named["table"]) == (TAP, "public_things"), named  # the SPEC's rule: `_` in the table only
        table = StaticTable.from_metadata(named["metadata_location"])
        assert table.current_snapshot().snapshot_id == named["snapshot"] and len(table.scan().to_arrow()) == 4
        assert ok(cli.run("project", *iceberg)).stdout == "nothing new to project\n"
        text = ok(cli.run("project", *iceberg, "--tap", TAP, "--stream", "public-things")).stdout  # nothing new: still named
        assert f"iceberg {TAP}.public_things: {named['metadata_location']}" in text, text
        assert f"iceberg {TAP}.public_things: file://" in ok(cli.run("ls")).stdout


# -- friction 8: the docs site ------------------------------------------------------------------------
def test_docs_site_shows_the_published_tables_and_where_annotations_come_from(local_lake, cli_session, tmp_path):
    cli = cli_session(local_lake)
    land_users(local_lake)
    land(local_lake.config, joined([schema_msg("later", SCHEMA, ["id"]), record_msg("later", USERS[0])]))
    ok(cli.run("project", "--stream", "users", "--tap", TAP))
    ok(cli.run("docs", "--out", str(tmp_path / "site")))
    index = (tmp_path / "site" / "index.html").read_text()
    for setting in ("owner", "description", "docs_url", "logs_url"):
        assert f"not set: the <code>{setting}</code> setting of target-singerlake" in index, setting
    assert "Delta v0" in index and "1 JSON-text column(s)" in index
    page = (tmp_path / "site" / "streams" / f"{TAP}.users.html").read_text()
    assert "Published tables" in page and f"published/{TAP}/users" in page and "version 0, 4 current rows" in page, page
    assert f"JSON text: {WHY}" in page and "<code>score</code>" in page
    later = (tmp_path / "site" / "streams" / f"{TAP}.later.html").read_text()
    assert "Not projected yet" in later
    assert os.path.exists(tmp_path / "site" / "streams" / f"{TAP}.later.html")


def test_a_chosen_type_holds_on_large_streams_bucket_by_bucket(local_lake, spark):
    """The same choice through the Python API on a stream projected in buckets (every stream large here): new rows,
    updated rows and the buckets they leave alone all carry the chosen type; a value that does not fit fails the
    stream, naming it, and leaves the table as it was."""
    from singerlake import Lake
    from singerlake.tables.project import project

    lake = Lake(local_lake.storage)
    land(local_lake.config, joined([schema_msg("users", SCHEMA, ["id"]), *(record_msg("users", user) for user in USERS)]))
    large = {"small_stream_bytes": 1, "types": {"users": {"score": "decimal(10,1)"}}}
    [result] = project(lake, spark, TAP, **large)
    land(local_lake.config, joined([schema_msg("users", SCHEMA, ["id"]), record_msg("users", {"id": 2, "name": "bob", "score": 9.96})]))
    [result] = project(lake, spark, TAP, **large)
    table = DeltaTable(str(Path(local_lake.config["lake_root"]) / "published" / TAP / "users"))
    rows = sorted(table.to_pyarrow_table().to_pylist(), key=lambda row: row["id"])
    assert str(table.to_pyarrow_table().schema.field("score").type) == "decimal128(10, 1)"
    assert [str(row["score"]) for row in rows] == ["3.7", "10.0", "7.3"]  # rounded half away from zero, as SQL's CAST
    assert result["version"] == 1 and "iceberg" not in result

    failures: list = []
    assert project(lake, spark, TAP, small_stream_bytes=1, types={"users": {"score": "long"}}, failures=failures) == []
    [failure] = failures
    assert failure.stream == "users" and "'score'" in failure.cause and "3.7" in failure.cause and "not an integer" in failure.cause
    assert DeltaTable(table.table_uri).version() == 1
