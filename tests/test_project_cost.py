"""A stream projected after every small landing, hundreds of times: a run's cost follows what changed,
not the table's history (SPEC.md §12: the log read from its newest entries, checkpoints every 6
versions, the open tail part). Every request is counted: on S3 by a counting proxy in front of the
server (delta-rs's too), locally by a counting storage (after the first run only our own code
touches the table)."""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable
from singerlake.lake import Lake
from singerlake.landing.writer import SchemaWriter
from singerlake.spark.session import OnDemand
from singerlake.storage import S3Storage
from singerlake.tables import delta
from singerlake.tables.delta_log import checkpoint_due
from singerlake.tables.project import project
from support.lakes import TAP, duckdb_for, record_msg
from support.s3_counter import counted_root
from support.storage import KINDS, Counting

pytestmark = pytest.mark.heavy

ROUNDS = int(os.environ.get("SINGERLAKE_COST_ROUNDS", "300"))  # fewer while iterating locally
PER_ROUND = 5
STREAM = "orders"
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "note": {"type": "string"}}}
T0 = 1_795_000_000_000


def land_round(lake: Lake, number: int) -> None:
    """One landing of ``PER_ROUND`` new orders (ids after every earlier round's), committed by the core."""
    message = {"type": "SCHEMA", "stream": STREAM, "schema": SCHEMA, "key_properties": ["id"]}
    ids = range(number * PER_ROUND, (number + 1) * PER_ROUND)
    with SchemaWriter(lake, TAP, message) as writer:
        lines = [record_msg(STREAM, {"id": i, "note": f"order {i}"}) for i in ids]
        writer.commit([writer.write_file(lines, [T0 + i for i in ids])])


def no_spark():
    raise AssertionError("a one-task run of a local master starts no Spark")


def run_rounds(lake: Lake, count_requests) -> tuple[dict[int, dict], dict[int, float]]:
    """``ROUNDS`` rounds of land then project; each project run's requests (by kind) and wall time."""
    spark = OnDemand(no_spark, "local[2]")
    counts, walls = {}, {}
    for number in range(ROUNDS):
        land_round(lake, number)
        started = time.perf_counter()
        with count_requests() as tally:
            result = project(lake, spark, TAP, STREAM)
        walls[number + 1] = time.perf_counter() - started
        counts[number + 1] = tally()
        assert result[0]["version"] == number and result[0]["rows"] == (number + 1) * PER_ROUND
    return counts, walls


def check_cost(counts: dict[int, dict], walls: dict[int, float], table_uri: str, options: dict) -> None:
    checkpoints = [n for n in counts if checkpoint_due(n - 1)]  # round n commits version n - 1
    print("round 10:", counts[10], f"{walls[10]:.3f} s; round {ROUNDS}:", counts[ROUNDS], f"{walls[ROUNDS]:.3f} s")
    print("checkpoint rounds:", {n: counts[n] for n in checkpoints[-2:]})
    normal = counts[10]
    assert not checkpoint_due(9) and set(normal) <= {"GET", "HEAD", "LIST", "PUT"}, normal
    for number in range(10, ROUNDS + 1):
        if number not in checkpoints:
            assert counts[number] == normal, f"round {number} made {counts[number]}, round 10 {normal}"
    for number in (n for n in checkpoints if n >= 10):
        extra = {kind: counts[number].get(kind, 0) - normal.get(kind, 0) for kind in counts[number]}
        assert all(0 <= counts[number].get(kind, 0) <= 2 * normal.get(kind, 0) for kind in counts[number]), (number, counts[number])
        assert extra.get("PUT") == 2, f"a checkpoint is two writes: {extra}"
    rows = DeltaTable(table_uri, storage_options=options).to_pyarrow_table()
    assert sorted(rows["id"].to_pylist()) == list(range(ROUNDS * PER_ROUND)), "every order, once"


def test_the_300th_incremental_project_costs_what_the_10th_does_on_a_local_lake(local_lake):
    counting = Counting(local_lake.storage)
    lake = Lake(counting)

    def tally():
        counting.clear()
        return contextlib.nullcontext(lambda: dict(Counter(KINDS[method] for method, _ in counting.requests)))

    counts, walls = run_rounds(lake, tally)
    check_cost(counts, walls, delta.table_uri(local_lake.storage, delta.table_key(TAP, STREAM)), {})
    parts = delta.latest(local_lake.storage, delta.table_key(TAP, STREAM)).state["parts"]
    assert len(parts) == 1, "1,500 small rows are one open part"
    uri = delta.table_uri(local_lake.storage, delta.table_key(TAP, STREAM))
    ids = duckdb_for(local_lake, "delta").execute(f"SELECT id FROM delta_scan('{uri}') ORDER BY id").fetchall()
    assert [row[0] for row in ids] == list(range(ROUNDS * PER_ROUND)), "DuckDB (delta-kernel) reads the table from our checkpoints"
    # Files replaced within the hour stay for time travel, however old they are: their tombstones are in the checkpoints.
    two_days_ago = time.time() - 2 * 86_400
    for path in Path(uri).glob("part-*.parquet"):
        os.utime(path, (two_days_ago, two_days_ago))
    assert DeltaTable(uri).vacuum(retention_hours=1, dry_run=True, enforce_retention_duration=False, full=True) == []
    assert len(DeltaTable(uri).vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False, full=True)) == ROUNDS - 1


def test_the_300th_incremental_project_costs_what_the_10th_does_on_s3(request, moto_server):
    root = counted_root(request, moto_server)
    storage = S3Storage(root.url, **root.options)
    lake = Lake(storage)

    def tally():
        mark = root.counter.mark()
        return contextlib.nullcontext(lambda: dict(root.counter.since(mark).kinds))

    counts, walls = run_rounds(lake, tally)
    check_cost(counts, walls, delta.table_uri(storage, delta.table_key(TAP, STREAM)), delta.storage_options(storage))
    last = max(n for n in counts if not checkpoint_due(n - 1))  # the goal, at the last round without a checkpoint
    assert counts[last]["PUT"] <= 4 and counts[last]["GET"] <= 8 and counts[last].get("LIST", 0) <= 2, counts[last]
