"""Partitioned tables (SPEC.md §12): `--partition-by` on record fields, keys that move between
partitions, a changed spec refused unless rebuilt; read back by delta-rs and DuckDB."""

from __future__ import annotations

import json
import re
from datetime import date, datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from singerlake.errors import ConfigError
from singerlake.format.exact import json_text
from singerlake.tables import delta
from singerlake.tables.delta import table_key
from singerlake.tables.project import project
from support.lake_cli import open_lake, run_cli
from support.lakes import TAP, duckdb_for, joined, land, record_msg, schema_msg
from support.projections import uri

STREAM = "orders"
PROPERTIES = {
    "id": {"type": "integer"},
    "status": {"type": ["string", "null"]},
    "created_at": {"type": "string", "format": "date-time"},
    "amount": {"type": "number"},
}
SCHEMA = {"type": "object", "properties": PROPERTIES}
BY_DAY = {STREAM: ["created_at:day"]}


def land_orders(lake, orders: list[dict]) -> None:
    land(lake.config, joined([schema_msg(STREAM, SCHEMA, ["id"]), *(record_msg(STREAM, json_text(order)) for order in orders)]))


def order(id_: int, day: int, status: str = "new", hour: int = 10) -> dict:
    return {"id": id_, "status": status, "created_at": f"2026-03-{day:02d}T{hour:02d}:30:00+01:00", "amount": id_ / 4}


def table_rows(lake, version: int | None = None) -> dict[int, dict]:
    table = DeltaTable(uri(lake, STREAM), version=version, storage_options=delta.storage_options(lake.storage))
    return {row["id"]: row for row in table.to_pyarrow_table().to_pylist()}


def add_actions(lake) -> list[dict]:
    table = DeltaTable(uri(lake, STREAM), storage_options=delta.storage_options(lake.storage))
    return pa.table(table.get_add_actions(flatten=True)).to_pylist()


def test_a_table_partitioned_by_day_holds_one_partition_per_file_and_readers_prune_by_it(local_lake, spark):
    orders = [order(i, 1 + i % 5) for i in range(1, 41)]
    land_orders(local_lake, orders)
    result = project(open_lake(local_lake), spark, TAP, partition_by=BY_DAY)[0]
    assert result["rows"] == 40
    table = DeltaTable(uri(local_lake, STREAM))
    assert table.metadata().partition_columns == ["created_at_day"]
    rows = table_rows(local_lake)
    for i in range(1, 41):  # 10:30 at +01:00 is 09:30 UTC, the same day
        expected_at = datetime(2026, 3, 1 + i % 5, 9, 30, tzinfo=timezone.utc)
        assert (rows[i]["created_at"], rows[i]["created_at_day"]) == (expected_at, expected_at.date())
    actions = add_actions(local_lake)
    assert sorted(action["partition.created_at_day"] for action in actions) == [date(2026, 3, day) for day in range(1, 6)]
    for action in actions:  # the partition column is in the files too, each file holding its partition's value only
        written = pq.read_table(f"{uri(local_lake, STREAM)}/{action['path']}").column("created_at_day").to_pylist()
        assert set(written) == {action["partition.created_at_day"]}
    one_day = DeltaTable(uri(local_lake, STREAM)).file_uris(file_pruning_predicate=[("created_at_day", "=", "2026-03-02")])
    assert len(one_day) == 1, "a one-day filter plans one file of five"
    duck = duckdb_for(local_lake, "delta")
    counted = duck.sql(f"SELECT count(*) FROM delta_scan('{uri(local_lake, STREAM)}') WHERE created_at_day = DATE '2026-03-02'")
    assert counted.fetchone()[0] == 8


def test_a_key_that_moves_to_another_partition_leaves_no_row_behind(local_lake, spark):
    land_orders(local_lake, [order(i, 1 + i % 3) for i in range(1, 31)])
    project(open_lake(local_lake), spark, TAP, partition_by=BY_DAY)
    before = {action["path"]: action["partition.created_at_day"] for action in add_actions(local_lake)}
    land_orders(local_lake, [order(3, 9, "moved"), order(4, 2, "stayed")])  # 3: day 1 -> 9; 4: day 2 -> 2
    result = project(open_lake(local_lake), spark, TAP, partition_by=BY_DAY)[0]
    assert result["rows"] == 30
    rows = table_rows(local_lake)
    assert (rows[3]["status"], rows[3]["created_at_day"]) == ("moved", date(2026, 3, 9))
    assert (rows[4]["status"], rows[4]["created_at_day"]) == ("stayed", date(2026, 3, 2))
    after = {action["path"]: action["partition.created_at_day"] for action in add_actions(local_lake)}
    kept = set(before) & set(after)
    assert {before[path] for path in kept} == {date(2026, 3, 3)}, "only the untouched day keeps its file"
    assert sorted(after.values()) == [date(2026, 3, day) for day in (1, 2, 3, 9)]

    land_orders(local_lake, [order(5, 9) | {"_sdc_deleted_at": "2026-03-10T00:00:00Z"}])
    project(open_lake(local_lake), spark, TAP, partition_by=BY_DAY)  # soft: the deleted row moves, marked
    rows = table_rows(local_lake)
    assert rows[5]["created_at_day"] == date(2026, 3, 9) and rows[5]["_sdc_deleted_at"] is not None and len(rows) == 30


def test_hard_deletes_and_moves_keep_one_row_per_key(local_lake, spark):
    land_orders(local_lake, [order(i, 1 + i % 3) for i in range(1, 13)])
    project(open_lake(local_lake), spark, TAP, partition_by=BY_DAY, hard_delete=True)
    land_orders(local_lake, [order(1, 7) | {"_sdc_deleted_at": "2026-03-10T00:00:00Z"}, order(2, 8), order(2, 9, "twice")])
    result = project(open_lake(local_lake), spark, TAP, partition_by=BY_DAY, hard_delete=True)[0]
    rows = table_rows(local_lake)
    assert 1 not in rows and result["rows"] == 11 == len(rows)
    assert (rows[2]["status"], rows[2]["created_at_day"]) == ("twice", date(2026, 3, 9))
    land_orders(local_lake, [order(4, 9) | {"amount": 123456.125}])  # a wider decimal: every file published again
    project(open_lake(local_lake), spark, TAP, partition_by=BY_DAY, hard_delete=True)
    rows = table_rows(local_lake)
    assert str(rows[4]["amount"]) == "123456.125" and rows[4]["created_at_day"] == date(2026, 3, 9) and len(rows) == 11
    assert sorted(a["partition.created_at_day"] for a in add_actions(local_lake)) == sorted({r["created_at_day"] for r in rows.values()})


def test_identity_and_hour_partitions(local_lake, spark):
    land_orders(local_lake, [order(i, 1, "paid" if i % 2 else None, hour=i % 3) for i in range(1, 13)])
    project(open_lake(local_lake), spark, TAP, partition_by=[f"{STREAM}=status,created_at:hour"])
    table = DeltaTable(uri(local_lake, STREAM))
    assert table.metadata().partition_columns == ["status", "created_at_hour"]
    values = {(a["partition.status"], a["partition.created_at_hour"]) for a in add_actions(local_lake)}
    hours = ["2026-02-28-23", "2026-03-01-00", "2026-03-01-01"]  # 00:30, 01:30, 02:30 at +01:00
    assert values == {(status, hour) for status in ("paid", None) for hour in hours}
    rows = table_rows(local_lake)
    assert all(rows[i]["status"] == ("paid" if i % 2 else None) and rows[i]["created_at_hour"] == hours[i % 3] for i in rows)


def test_a_changed_spec_is_refused_unless_rebuilt(local_lake, spark):
    land_orders(local_lake, [order(i, 1 + i % 4) for i in range(1, 21)])
    project(open_lake(local_lake), spark, TAP, partition_by=BY_DAY)
    land_orders(local_lake, [order(21, 2)])
    unpartitioned = run_cli(local_lake, "project", "--tap", TAP)
    assert unpartitioned.returncode == 1, unpartitioned.stderr
    line = [line for line in unpartitioned.stderr.splitlines() if STREAM in line]
    assert line and "partitioned by created_at:day, this run asks for none" in line[0] and "--rebuild" in line[0]
    assert "Traceback" not in unpartitioned.stderr
    rebuilt = run_cli(local_lake, "project", "--tap", TAP, "--partition-by", f"{STREAM}=created_at:month", "--rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr
    table = DeltaTable(uri(local_lake, STREAM))
    assert table.version() == 1 and table.metadata().partition_columns == ["created_at_month"]
    assert {row["created_at_month"] for row in table_rows(local_lake).values()} == {"2026-03"} and len(table_rows(local_lake)) == 21
    assert len(table_rows(local_lake, 0)) == 20 and "created_at_day" in table_rows(local_lake, 0)[1], "version 0 stays readable"
    state = delta.latest(local_lake.storage, table_key(TAP, STREAM)).state
    assert state["partitioning"] == [{"field": "created_at", "transform": "month", "column": "created_at_month"}]


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("orders=nope:day", "no property 'nope'"),
        ("orders=amount:day", "'amount' is number"),
        ("orders=id:week", "'id:week' is not FIELD[:TRANSFORM]"),
        ("others=id", "no selected stream is named 'others'"),
    ],
)
def test_a_bad_partition_spec_is_one_line_and_exit_2(local_lake, spec, named):
    land_orders(local_lake, [order(1, 1)])
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        project(open_lake(local_lake), None, TAP, partition_by=[spec])
    done = run_cli(local_lake, "project", "--partition-by", spec)
    assert done.returncode == 2 and named in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_value_a_transform_cannot_read_fails_its_stream_naming_the_column(local_lake, spark):
    loose = {"type": "object", "properties": PROPERTIES}
    land(local_lake.config, joined([schema_msg(STREAM, loose, ["id"]), record_msg(STREAM, json.dumps({"id": 1, "created_at": "soon"}))]))
    failures: list = []
    assert project(open_lake(local_lake), spark, TAP, partition_by=BY_DAY, failures=failures) == []
    assert len(failures) == 1 and "partition column 'created_at_day'" in failures[0].cause and "commit 1, record 0" in failures[0].cause


def test_the_iceberg_table_is_partitioned_alike_and_prunes_by_the_partition_columns(local_lake, spark, tmp_path, monkeypatch):
    from pyiceberg.expressions import EqualTo
    from singerlake.tables.iceberg import open_catalog

    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", f"sqlite:///{tmp_path}/catalog.db")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__WAREHOUSE", f"file://{tmp_path}/warehouse")
    formats = {"formats": ["delta", "iceberg"], "iceberg_catalog": "lake"}
    land_orders(local_lake, [order(i, 1 + i % 4, "paid" if i % 2 else "new") for i in range(1, 41)])
    project(open_lake(local_lake), spark, TAP, partition_by=[f"{STREAM}=created_at:day,status"], **formats)
    land_orders(local_lake, [order(2, 9, "moved")])  # from day 3 to day 9
    project(open_lake(local_lake), spark, TAP, partition_by=[f"{STREAM}=created_at:day,status"], **formats)
    table = open_catalog("lake", local_lake.storage).load_table((TAP, STREAM))
    assert [(field.name, str(field.transform)) for field in table.spec().fields] == [("created_at_day", "identity"), ("status", "identity")]
    rows = {row["id"]: row for row in table.scan().to_arrow().to_pylist()}
    assert len(rows) == 40 and (rows[2]["status"], rows[2]["created_at_day"]) == ("moved", date(2026, 3, 9))
    assert rows == table_rows(local_lake), "Iceberg reads what Delta reads"
    one_day = table.scan(row_filter=EqualTo("created_at_day", "2026-03-02"))
    files = list(one_day.plan_files())  # each day holds one status here (odd ids are paid): 4 files and key 2's
    assert len(files) == 1 and len(list(table.scan().plan_files())) == 5
    assert [files[0].file.partition[0], files[0].file.partition[1]] == [(date(2026, 3, 2) - date(1970, 1, 1)).days, "paid"]
    assert {row["created_at_day"] for row in one_day.to_arrow().to_pylist()} == {date(2026, 3, 2)}


def files_planned(frame) -> int:
    """The published files a query's plan reads: each scan is a range of its files' numbers (``sql.current_rows``)."""
    plan = frame._jdf.queryExecution().executedPlan().toString()
    return sum(int(files) for files in re.findall(r"Range \(0, (\d+),", plan))


def test_a_filter_on_a_partition_column_plans_only_its_partitions_files_in_singerlake_sql(local_lake, spark):
    from singerlake.tables.sql import current_rows

    land_orders(local_lake, [order(i, 1 + i % 5, "paid" if i % 3 else "new") for i in range(1, 41)])
    project(open_lake(local_lake), spark, TAP, partition_by=[f"{STREAM}=created_at:day,status"])
    rows = current_rows(open_lake(local_lake), spark, TAP, STREAM)  # one view for every statement, as in the shell
    planned = lambda where: files_planned(rows.where(where))  # noqa: E731
    assert planned("true") == 10  # 5 days x 2 statuses
    assert planned("created_at_day = DATE '2026-03-02'") == 2
    assert planned("created_at_day = DATE '2026-03-02' AND status = 'new'") == 1
    assert planned("created_at_day = DATE '2026-03-02' OR amount > 0") == 10, "an OR with another column prunes nothing"
    assert planned("created_at_day > DATE '2026-03-03'") == 4 and planned("amount > 5") == 10  # not a partition column
    assert rows.count() == 40 and rows.where("created_at_day >= DATE '2026-03-03'").count() == 24
    self_join = "SELECT count(*) FROM orders a JOIN orders b ON a.id = b.id WHERE a.created_at_day = DATE '2026-03-02'"
    assert json.loads(run_cli(local_lake, "sql", self_join, "--json").stdout) == [{"count(1)": 8}]
    done = run_cli(
        local_lake,
        "sql",
        "SELECT count(*) AS n, min(id) AS low FROM orders WHERE created_at_day = DATE '2026-03-02' AND status = 'new'",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    expected = [i for i in range(1, 41) if 1 + i % 5 == 2 and not i % 3]
    assert json.loads(done.stdout) == [{"n": len(expected), "low": min(expected)}]


@pytest.mark.parametrize(
    "exchange",
    ["block files", "block files, each file, key bucket and partition's blocks a task of their own", "shuffle"],
)
def test_a_large_partitioned_stream_starts_its_table_on_spark_tasks_as_one_task_would(local_lake, spark, monkeypatch, exchange):
    """Partitions with keys beside them (through files on this machine), or key buckets then partitions (Spark's
    shuffle on a cluster, as if here): a key landed three times on different days keeps only its latest row, deleted rows stay
    marked, and a partition of more rows than a part holds is several parts; the next run (one task)
    moves keys from those parts."""
    import singerlake.tables.partitioned

    if exchange == "shuffle":
        monkeypatch.setattr(singerlake.tables.partitioned, "runs_elsewhere", lambda session: True)
    elif exchange.endswith("of their own"):  # a partition of more bytes than a task holds: split among tasks
        monkeypatch.setattr(singerlake.tables.partitioned, "PARTITION_TASK_BYTES", 1)
        monkeypatch.setattr(singerlake.tables.partitioned, "KEY_TASK_BYTES", 1)  # and keys in many buckets
        monkeypatch.setattr(singerlake.tables.partitioned, "READ_TASK_BYTES", 1)  # each landing's file read by a task of its own
    land_orders(local_lake, [order(i, 1 + i % 4) for i in range(1, 61)])
    land_orders(local_lake, [order(7, 9, "moved"), order(8, 8) | {"_sdc_deleted_at": "2026-03-10T00:00:00Z"}])
    land_orders(local_lake, [order(7, 6, "moved again")])
    lake = open_lake(local_lake)
    result = project(lake, spark, TAP, partition_by=BY_DAY, small_stream_bytes=1, part_rows=4)[0]
    large = table_rows(local_lake)
    assert result["rows"] == 60 == len(large)
    assert (large[7]["status"], large[7]["created_at_day"]) == ("moved again", date(2026, 3, 6))
    assert large[8]["created_at_day"] == date(2026, 3, 8) and large[8]["_sdc_deleted_at"] is not None
    actions = add_actions(local_lake)
    for action in actions:  # each file one partition's rows, at most part_rows of them
        written = pq.read_table(f"{uri(local_lake, STREAM)}/{action['path']}").column("created_at_day").to_pylist()
        assert set(written) == {action["partition.created_at_day"]} and len(written) <= 4
    assert sum(action["num_records"] for action in actions) == 60
    state = delta.latest(lake.storage, table_key(TAP, STREAM)).state
    assert "buckets" not in state and all("partition" in part for part in state["parts"])

    project(lake, spark, TAP, partition_by=BY_DAY, rebuild=True)  # the one-task path, from the same records
    assert table_rows(local_lake) == large

    land_orders(local_lake, [order(3, 9, "moved"), order(61, 2)])
    assert project(lake, spark, TAP, partition_by=BY_DAY, small_stream_bytes=1)[0]["rows"] == 61
    rows = table_rows(local_lake)
    assert (rows[3]["status"], rows[3]["created_at_day"], len(rows)) == ("moved", date(2026, 3, 9), 61)


def test_partitions_whose_numbers_collide_in_the_exchange_are_told_apart_by_the_partition_they_carry():
    from singerlake.tables.partitioned import PARTITION, by_partition

    days = ['{"created_at_day":"2026-03-01"}', '{"created_at_day":"2026-03-02"}', '{"created_at_day":null}']
    rows = pa.table({"_key": ["1", "2", "3", "4"], PARTITION: [days[0], days[1], days[0], days[2]]})
    typed = pa.table({"id": [1, 2, 3, 4]})
    groups = {
        json.dumps(partition): (held["_key"].to_pylist(), held_typed["id"].to_pylist())
        for partition, held, held_typed in by_partition(rows, typed)
    }
    assert groups == {
        '{"created_at_day": "2026-03-01"}': (["1", "3"], [1, 3]),
        '{"created_at_day": "2026-03-02"}': (["2"], [2]),
        '{"created_at_day": null}': (["4"], [4]),
    }
