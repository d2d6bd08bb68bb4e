"""Projections (SPEC.md §12): exact column types in Delta tables, read by readers this project did not
write (delta-rs, Polars, DuckDB's delta extension), locally and from moto's HTTP S3; `singerlake sql`."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from singerlake.format.exact import decode, join_all, json_text, need_of, records_needs
from singerlake.jobs.vacuum import vacuum
from singerlake.tables import blocks, delta, delta_log
from singerlake.tables.blocks import bucket_of
from singerlake.tables.delta import storage_options, table_key
from singerlake.tables.plan import plan_stream, work_item
from singerlake.tables.project import project
from singerlake.tables.small import project_on_executor
from support.lake_cli import LakeCli, open_lake
from support.lakes import TAP, LakeUnderTest, duckdb_for, joined, land, local_lake_at, record_msg, schema_msg
from support.projections import EXPECTED, FIRST, STREAM, TRICKY, back_to_json, by_id, check_exact, land_records, same, uri
from support.storage import Counting


def test_published_delta_table_is_exact_and_changes_only_what_must_change(lake, spark):
    """Parts of ``len(FIRST)`` rows are full, so the first one is no open tail (SPEC.md §12): a new key
    adds a part beside it, and an update rewrites only the part holding its key."""
    land_records(lake, FIRST)
    rows = len(FIRST)
    assert project(open_lake(lake), spark, TAP, part_rows=rows)[0]["version"] == 0
    table = DeltaTable(uri(lake), storage_options=storage_options(lake.storage))
    check_exact(by_id(table.to_pyarrow_table().to_pylist()))
    fields = {field.name: field for field in table.schema().fields}
    assert str(fields["amount"].type) == 'PrimitiveType("decimal(38,18)")'
    assert fields["doc"].metadata["singerlake.json"] == "true" and fields["huge"].metadata["singerlake.json"] == "true"
    polars = pl.read_delta(uri(lake), storage_options=storage_options(lake.storage) or None)
    check_exact(by_id(polars.to_dicts()))

    land_records(lake, ['{"id": 4, "amount": 1, "big": 2, "huge": 3}'])
    assert project(open_lake(lake), spark, TAP, part_rows=rows)[0]["version"] == 1
    land_records(lake, ['{"id": 4, "amount": 2.25, "big": 5, "huge": 4}'])
    assert project(open_lake(lake), spark, TAP, part_rows=rows)[0]["version"] == 2
    files = {
        version: set(DeltaTable(uri(lake), version=version, storage_options=storage_options(lake.storage)).file_uris())
        for version in (0, 1, 2)
    }
    assert len(files[0]) == 1 and files[0] < files[1] and len(files[1]) == 2  # a new key: one file added, none rewritten
    assert files[0] < files[2] and files[1] - files[2] and len(files[2]) == 2  # key 4 updated: only its file replaced
    latest = DeltaTable(uri(lake), storage_options=storage_options(lake.storage)).to_pyarrow_table().to_pylist()
    assert by_id(latest)[4]["amount"] == Decimal("2.25") and len(latest) == 4


def test_an_update_trims_its_part_and_the_column_type_does_not_narrow(local_lake, spark):
    """A small stream's previous (full) part holding an updated key is rewritten by filtering its staging
    and published rows alike; the row that needed the widest decimal is gone, yet the column keeps its
    type, so readers see the same schema."""
    stream = "public.prices"
    properties = {"id": {"type": "integer"}, "price": {"type": "number"}, "at": {"type": "string", "format": "date-time"}}
    schema = {"type": "object", "properties": properties}
    price = {i: Decimal("1.125") if i == 1 else Decimal(i) / 2 for i in range(1, 41)}
    rows = [{"id": i, "price": price[i], "at": f"2024-05-0{1 + i % 9}T10:00:00Z"} for i in range(1, 41)]
    land(local_lake.config, joined([schema_msg(stream, schema, ["id"]), *(record_msg(stream, json_text(row)) for row in rows)]))
    project(open_lake(local_lake), spark, TAP, part_rows=len(rows))
    first = delta.latest(local_lake.storage, table_key(TAP, stream)).state["parts"]
    update = {"id": 1, "price": Decimal("3.5"), "at": "2024-06-01T00:00:00Z"}
    land(local_lake.config, joined([schema_msg(stream, schema, ["id"]), record_msg(stream, json_text(update))]))
    result = project(open_lake(local_lake), spark, TAP, part_rows=len(rows))[0]
    assert result["version"] == 1 and result["rows"] == 40
    actions = delta_actions(local_lake, 1, stream)
    assert actions["remove"] == {first[0]["published"]} and len(actions["add"]) == 2  # the trimmed part and the new row's
    table = DeltaTable(uri(local_lake, stream))
    assert table.schema() == DeltaTable(uri(local_lake, stream), version=0).schema(), "the columns keep the types of version 0"
    assert str(table.schema().fields[1].type) == 'PrimitiveType("decimal(5,3)")'  # 20.0 and 1.125 held it; 1.125 is gone
    got = {row["id"]: row for row in table.to_pyarrow_table().to_pylist()}
    assert got[1]["price"] == Decimal("3.5") and got[1]["at"] == datetime(2024, 6, 1, tzinfo=timezone.utc)
    assert {i: (got[i]["price"], got[i]["at"]) for i in range(2, 41)} == {
        i: (Decimal(i) / 2, datetime(2024, 5, 1 + i % 9, 10, tzinfo=timezone.utc)) for i in range(2, 41)
    }


def test_new_rows_join_the_open_tail_and_a_run_reads_only_the_parts_its_keys_may_be_in(local_lake, spark):
    """A stream projected after every small landing keeps a bounded number of parts: the last part, while
    small, takes each run's new rows. A run reads a full part only when its key range may hold a key the
    new records update (SPEC.md §12): new ids above every range read none of them."""
    stream = "public.grow"
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "v": {"type": "string"}}}
    expected: dict[int, str] = {}

    def land_ids(ids, value: str) -> None:
        expected.update({i: f"{value} {i}" for i in ids})
        rows = [record_msg(stream, {"id": i, "v": f"{value} {i}"}) for i in ids]
        land(local_lake.config, joined([schema_msg(stream, schema, ["id"]), *rows]))

    land_ids(range(100), "first")
    project(open_lake(local_lake), spark, TAP, part_rows=50)
    for round_ in range(5):
        land_ids(range(100 + 3 * round_, 103 + 3 * round_), f"round {round_}")
        project(open_lake(local_lake), spark, TAP, part_rows=50)
    parts = delta.latest(local_lake.storage, table_key(TAP, stream)).state["parts"]
    assert [part["rows"] for part in parts] == [50, 50, 15], "five runs' rows are one tail part"
    assert [part["keys"] for part in parts] == [["[0]", "[49]"], ["[50]", "[99]"], ["[100]", "[114]"]]

    land_ids([200, 10], "update")  # 10 is in the first part's range, 200 in none
    plan = plan_stream(open_lake(local_lake), TAP, stream)
    counting = Counting(local_lake.storage)
    result = project_on_executor(counting, work_item(plan, ["delta"]) | {"part_rows": 50})
    staging_reads = [key for method, key in counting.requests if method == "read" and key.startswith("staging/")]
    assert sorted(staging_reads) == sorted([parts[0]["staging"]] * 2 + [parts[2]["staging"]]), "its keys, then its rows; and the tail"
    assert [part["rows"] for part in result["parts"]] == [50, 49, 17], "the newest rows in the last part"
    assert {part["staging"] for part in result["parts"]} & {part["staging"] for part in parts} == {parts[1]["staging"]}


def delta_actions(lake: LakeUnderTest, version: int, stream: str) -> dict[str, set[str]]:
    """The files a version's commit adds and removes, as its Delta log entry records them."""
    log = lake.read(f"{table_key(TAP, stream)}/_delta_log/{version:020d}.json").decode()
    actions = [json.loads(line) for line in log.splitlines() if line.strip()]
    return {kind: {action[kind]["path"] for action in actions if kind in action} for kind in ("add", "remove")}


def test_large_streams_rewrite_only_the_buckets_their_new_records_touch(local_lake, spark):
    """A stream above the small-stream size (lowered here) is kept in buckets of keys: a run that
    updates a few keys removes and adds only their buckets' files, in one Delta commit."""
    stream = "public.big"
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "v": {"type": "string"}, "n": {"type": "number"}}}
    expected = {}

    def land_rows(rows: list[dict]) -> None:
        expected.update({row["id"]: row for row in rows})
        land(local_lake.config, joined([schema_msg(stream, schema, ["id"]), *(record_msg(stream, row) for row in rows)]))

    def published() -> dict:
        rows = DeltaTable(uri(local_lake, stream)).to_pyarrow_table().to_pylist()
        assert len(rows) == len({row["id"] for row in rows}), "one row per key"
        return {row["id"]: {"id": row["id"], "v": row["v"], "n": row["n"]} for row in rows}

    land_rows([{"id": i, "v": f"first {i}" * 3, "n": i / 4} for i in range(3000)])
    stored = sum(entry["size"] for entry in local_lake.manifest(stream)["files"])
    threshold = stored // 2  # large: buckets of a quarter of that, so about 8 of them
    assert project(open_lake(local_lake), spark, TAP, small_stream_bytes=threshold)[0]["version"] == 0
    first = delta.latest(local_lake.storage, table_key(TAP, stream)).state
    buckets = first["buckets"]
    assert buckets >= 8 and sorted(part["bucket"] for part in first["parts"]) == list(range(buckets))
    assert published() == expected

    updates = [{"id": i, "v": f"second {i}", "n": 0.5} for i in (7, 2024)] + [{"id": 5000, "v": "new", "n": 1}]
    land_rows(updates)
    result = project(open_lake(local_lake), spark, TAP, small_stream_bytes=threshold)[0]
    assert result["version"] == 1 and result["new_records"] == 3 and result["rows"] == 3001
    touched = {bucket_of(json_text([row["id"]]), buckets) for row in updates}
    second = delta.latest(local_lake.storage, table_key(TAP, stream)).state
    assert second["buckets"] == buckets and len(touched) < buckets
    before, after = ({part["bucket"]: part for part in state["parts"]} for state in (first, second))
    changed = {bucket for bucket in after if after[bucket] != before.get(bucket)}
    assert changed == touched, "only the buckets the new records touch are rewritten"
    assert delta_actions(local_lake, 1, stream) == {
        "remove": {before[bucket]["published"] for bucket in touched},
        "add": {after[bucket]["published"] for bucket in touched},
    }
    assert published() == expected
    assert published()[2024]["v"] == "second 2024" and published()[5000]["n"] == Decimal(1)

    land_rows([{"id": 7, "v": "third", "n": 0.125}])  # a scale the column's decimal(p, 2) cannot hold: every file anew
    assert project(open_lake(local_lake), spark, TAP, small_stream_bytes=threshold)[0]["version"] == 2
    third = delta.latest(local_lake.storage, table_key(TAP, stream)).state
    assert third["buckets"] == buckets and len(delta_actions(local_lake, 2, stream)["add"]) == buckets
    assert not {part["published"] for part in third["parts"]} & delta_actions(local_lake, 1, stream)["add"]
    assert published() == expected and str(DeltaTable(uri(local_lake, stream)).schema().fields[2].type) == 'PrimitiveType("decimal(6,3)")'


def test_blocks_a_task_has_written_give_their_space_back_and_cannot_be_read_again(tmp_path):
    """A write task releases the blocks it read once its parts are written: their bytes become holes
    in the block file, the other buckets' blocks there stay readable, and a released block read again
    (a retried task) fails instead of reading as a bucket without rows."""
    import os

    import pyarrow as pa

    def rows(count: int):
        return pa.table({"_singerlake_commit": [1] * count, "_singerlake_index": list(range(count)), "_record": ["x" * 200] * count})

    written = blocks.write_block_file(str(tmp_path), [(0, rows(20_000), rows(5)), (1, rows(20_000), None)])
    refs = [ref for batch in written for ref in batch.to_pylist()]
    by_bucket = blocks.by_bucket(refs)
    file = Path(refs[0]["file"])
    held = file.stat().st_blocks
    blocks.release({0: by_bucket[0]})
    if os.uname().sysname == "Linux":
        assert file.stat().st_blocks < held * 0.6, "bucket 0's bytes are given back"
        with pytest.raises(pa.ArrowInvalid):
            list(blocks.file_groups({0: by_bucket[0]}))
    assert [(bucket, kept.num_rows, typed) for bucket, kept, typed in blocks.file_groups({1: by_bucket[1]})] == [(1, 20_000, None)]
    assert file.stat().st_size == sum(ref["rows"] + ref["typed"] for ref in refs), "the file keeps its size"


def test_large_keyless_streams_add_their_new_rows_and_rewrite_nothing(local_lake, spark):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "v": {"type": "string"}}}
    for first, count in ((0, 2000), (2000, 5)):
        rows = [{"n": n, "v": f"value {n}" * 3} for n in range(first, first + count)]
        land(local_lake.config, joined([schema_msg("events", schema, []), *(record_msg("events", row) for row in rows)]))
        result = project(open_lake(local_lake), spark, TAP, small_stream_bytes=1)[0]
        assert result["new_records"] == count and result["rows"] == first + count
    second = delta_actions(local_lake, 1, "events")
    assert not second["remove"] and len(second["add"]) == 1  # the 5 new rows: one new part, no file rewritten
    assert "buckets" not in delta.latest(local_lake.storage, table_key(TAP, "events")).state
    assert sorted(row["n"] for row in DeltaTable(uri(local_lake, "events")).to_pyarrow_table().to_pylist()) == list(range(2005))


def test_duckdb_reads_the_published_table(lake, spark):
    land_records(lake, FIRST)
    project(open_lake(lake), spark, TAP)
    connection = duckdb_for(lake, "delta")
    result = connection.sql(f"SELECT * FROM delta_scan('{uri(lake)}')")
    check_exact(by_id([dict(zip(result.columns, row, strict=True)) for row in result.fetchall()]))


# -- property: published values round-trip to the raw ones -------------------------------------------
PROPERTY_SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "number"},
        "i": {"type": "integer"},
        "j": {},
        "s": {"type": "string"},
        "o.x y": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "string"}}},
        "arr": {"type": "array", "items": {"type": "integer"}},
    },
}
numbers = st.one_of(
    st.integers(-(10**45), 10**45),
    st.decimals(allow_nan=False, allow_infinity=False),
)
json_looking = st.sampled_from(['{"a": 1}', '"q"', "1.5", "null", "[1,2]", "true", ""]) | st.text(max_size=8)
scalars = st.one_of(st.none(), st.booleans(), numbers, json_looking)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8
)
records = st.fixed_dictionaries(
    {},
    optional={
        "n": numbers | json_values,
        "i": st.integers(-(10**40), 10**40) | json_values,
        "j": json_values,
        "s": json_looking | json_values,
        "o.x y": st.fixed_dictionaries({}, optional={"a": numbers, "b": st.text(max_size=5)}) | json_values,
        "arr": st.lists(st.integers(-(2**70), 2**70) | st.none(), max_size=4) | json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(batch=st.lists(records, max_size=25))
def test_a_columns_need_is_the_join_of_its_values_needs(batch):
    """records_needs recognises plain columns whole: the same as joining every value's need."""
    values = [decode(json_text(record)) for record in batch]
    joined = join_all(
        [{name: need_of(spec, record.get(name)) for name, spec in PROPERTY_SCHEMA["properties"].items()} for record in values]
    )
    assert records_needs(PROPERTY_SCHEMA["properties"], values) == {name: joined.get(name) for name in PROPERTY_SCHEMA["properties"]}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(records, min_size=1, max_size=25))
def test_published_values_round_trip_to_the_raw_values(tmp_path_factory, spark, batch):
    lake = local_lake_at(tmp_path_factory.mktemp("prop"))
    texts = [json_text({"id": number, **record}) for number, record in enumerate(batch)]
    land_records(lake, texts, schema={"type": "object", "properties": {"id": {"type": "integer"}, **PROPERTY_SCHEMA["properties"]}})
    project(open_lake(lake), spark, TAP)
    table = DeltaTable(uri(lake)).to_pyarrow_table()
    rows = by_id(table.to_pylist())
    for number, text in enumerate(texts):
        raw = decode(text)
        for field in table.schema:
            got, expected = back_to_json(rows[number][field.name], field), raw.get(field.name)
            if isinstance(got, dict) and isinstance(expected, dict) and not field.metadata:
                expected = {k: v for k, v in expected.items() if v is not None}
            assert same(got, expected), (field, rows[number][field.name], expected)


# -- singerlake sql ----------------------------------------------------------------------------------
def sql(cli: LakeCli, query: str, *options: str):
    """``singerlake sql`` through main(), in the module's CliSession (one Spark start for every command)."""
    return cli.run("sql", query, *options)


def test_sql_queries_current_rows_by_stream_name_as_json_csv_and_a_table(lake, spark, cli_session):
    cli = cli_session(lake)
    land_records(lake, FIRST)
    land_records(lake, ['{"id": 2, "amount": 99.5, "big": 3, "huge": 1}'])
    project(open_lake(lake), spark, TAP)
    query = f"SELECT id, `qty.count`, amount, doc, `with space €``x` FROM `{STREAM}` ORDER BY id"
    out = sql(cli, query, "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = decode(out.stdout)
    assert [row["id"] for row in rows] == [1, 2, 3]
    assert rows[0]["amount"] == Decimal("12345678901234567890.123456789012345678") and rows[1]["amount"] == Decimal("99.5")
    assert rows[0]["doc"] == '"just a string"' and rows[2]["doc"] == '{"a":1,"b":[true,null,2.50]}'
    assert rows[0]["with space €`x"] == "ü"

    listed = sql(cli, f"SELECT id, doc FROM `{STREAM}` ORDER BY id", "--csv")
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert list(csv.reader(io.StringIO(listed.stdout))) == [
        ["id", "doc"],
        ["1", '"just a string"'],
        ["2", ""],
        ["3", '{"a":1,"b":[true,null,2.50]}'],
    ]

    raw = sql(cli, f"SELECT count(*) AS records, count(DISTINCT _singerlake_commit) AS commits FROM `{STREAM}`", "--raw")
    assert raw.returncode == 0, raw.stderr[-3000:]
    assert raw.stdout.splitlines() == ["records | commits", "--------+--------", "4       | 2", "(1 row)"], raw.stdout


def test_sql_raw_gives_every_record_exactly_with_its_position(lake, cli_session):
    """`singerlake sql --raw`: the data source types every landed record as the projection types the current rows."""
    cli = cli_session(lake)
    land_records(lake, FIRST)
    land_records(lake, ['{"id": 2, "amount": 99.5, "big": 3, "doc": {"a": 1}, "huge": 1}'])
    columns = "id, `qty.count`, amount, big, doc, huge, `with space €``x`, tags, at, _singerlake_commit, _singerlake_index"
    types = "typeof(amount) AS amount, typeof(big) AS big, typeof(doc) AS doc, typeof(huge) AS huge, typeof(`qty.count`) AS q"
    query = f"SELECT {columns}, {types.replace(' AS ', ' AS t_')} FROM `{STREAM}` ORDER BY _singerlake_commit, _singerlake_index"
    out = sql(cli, query, "--raw", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = decode(out.stdout)
    positions = [(row["id"], row["_singerlake_commit"], row["_singerlake_index"]) for row in rows]
    assert positions == [(1, 1, 0), (2, 1, 1), (3, 1, 2), (2, 2, 0)]
    assert {k: v for k, v in rows[0].items() if k.startswith("t_")} == {
        "t_amount": "decimal(38,18)",  # numeric(38,18)-like: exact, not a double
        "t_big": "decimal(30,0)",  # beyond 64 bits: exact, not null
        "t_doc": "string",
        "t_huge": "string",
        "t_q": "decimal(2,1)",
    }
    assert rows[0]["amount"] == Decimal("12345678901234567890.123456789012345678")
    assert rows[1]["amount"] == Decimal("-0.000000000000000001") and rows[3]["amount"] == Decimal("99.5")
    assert rows[0]["big"] == 123456789012345678901234567890 and rows[2]["big"] == -(2**63)
    assert [row["doc"] for row in rows] == ['"just a string"', '"{\\"a\\": 1}"', '{"a":1,"b":[true,null,2.50]}', '{"a":1}']
    assert [row["huge"] for row in rows] == ["1E+400", "0.1", "2", "1"]
    assert rows[0]["qty.count"] == Decimal("1.5") and rows[0]["with space €`x"] == "ü" and rows[0]["tags"] == [1, 2]
    assert datetime.fromisoformat(rows[0]["at"]).astimezone(timezone.utc) == EXPECTED[1]["at"]  # Spark gives local time


def test_sql_errors_are_one_line_with_exit_2(local_lake, spark, cli_session):
    cli = cli_session(local_lake)
    land_records(local_lake, FIRST)
    land(local_lake.config | {"tap_id": "tap-other"}, joined([schema_msg("x", TRICKY, ["id"]), record_msg("x", FIRST[0])]))
    project(open_lake(local_lake), spark)
    several = sql(cli, f"SELECT * FROM `{STREAM}`")
    assert several.returncode == 2 and "--tap" in several.stderr and "Traceback" not in several.stderr
    wrong = sql(cli, "SELECT nope FROM `public.tricky`", "--tap", TAP)
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr[-3000:]
    errors = [line for line in wrong.stderr.splitlines() if line.startswith("singerlake sql: error:")]
    assert len(errors) == 1 and "nope" in errors[0] and "SQLSTATE" in errors[0], wrong.stderr[-3000:]
    table = sql(cli, "SELECT count(*) AS n FROM x", "--tap", "tap-other")
    assert table.returncode == 0 and table.stdout.splitlines() == ["n", "-", "1", "(1 row)"], table.stdout


def test_vacuum_deletes_replaced_delta_and_staging_files_after_the_retention(local_lake, spark):
    land_records(local_lake, FIRST)
    project(open_lake(local_lake), spark, TAP)
    land_records(local_lake, ['{"id": 2, "amount": 1, "big": 1, "huge": 1}'])
    project(open_lake(local_lake), spark, TAP)
    old = set(DeltaTable(uri(local_lake), version=0).file_uris())
    assert vacuum(open_lake(local_lake), retention_s=7 * 86400, apply=True) == []  # nothing is old enough
    deleted = vacuum(open_lake(local_lake), retention_s=0, apply=True, force=True)
    assert {Path(p).name for p in old} <= {Path(d.path).name for d in deleted}
    assert any(d.path.startswith("staging/") for d in deleted)
    latest = DeltaTable(uri(local_lake)).to_pyarrow_table().to_pylist()
    assert len(latest) == 3 and by_id(latest)[2]["amount"] == Decimal(1)
    [again] = project(open_lake(local_lake), spark, TAP, STREAM)  # planned though nothing is new
    assert again["rows"] == 3  # the staging parts it needs are still there
    with pytest.raises(Exception):  # noqa: B017  (delta-rs raises its own error types)
        DeltaTable(uri(local_lake), version=0).to_pyarrow_table()
    assert json.loads(json.dumps([d.to_dict() for d in deleted]))


def test_a_state_of_many_parts_is_stored_compressed_and_the_next_run_plans_from_it(local_lake, spark):
    """80 one-row parts: the commit stores their list compressed (every Delta reader parses the whole log
    entry), the next run reads it back and rewrites only the part holding the key it updates."""
    land_records(local_lake, [json.dumps({"id": n, "amount": n, "big": n, "huge": n}) for n in range(1, 81)])
    project(open_lake(local_lake), spark, TAP, part_rows=1)
    key = table_key(TAP, STREAM)
    entry = delta_log.read_actions(local_lake.storage, key, 0)
    stored = next(action["commitInfo"] for action in entry if "commitInfo" in action)["singerlake"]
    state = delta.latest(local_lake.storage, key).state
    assert isinstance(stored["parts"], str) and len(state["parts"]) == 80
    assert len(stored["parts"]) < len(json.dumps(state["parts"])) / 4
    before = set(DeltaTable(uri(local_lake)).file_uris())

    land_records(local_lake, ['{"id": 7, "amount": 70, "big": 7, "huge": 7}'])
    assert project(open_lake(local_lake), spark, TAP, part_rows=1)[0]["version"] == 1
    table = DeltaTable(uri(local_lake))
    after = set(table.file_uris())
    assert len(before - after) == 1 and len(after - before) == 1, "only the part holding key 7 is rewritten"
    rows = by_id(table.to_pyarrow_table().to_pylist())
    assert len(rows) == 80 and rows[7]["amount"] == Decimal(70) and rows[8]["amount"] == Decimal(8)
    assert len(delta.latest(local_lake.storage, key).state["parts"]) == 80
