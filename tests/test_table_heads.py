"""Table heads (SPEC.md §12): a project run plans each stream from the version ``published/<tap>/heads.json``
names, without listing the Delta log, and a stale head (another writer committed since) costs a second
plan of that stream in the same run, never a lost or doubled row.

The core's ``project`` on a local lake (a one-task run of a local master starts no Spark), requests counted
by a counting storage.
"""

from __future__ import annotations

import json

from deltalake import DeltaTable
from singerlake.jobs.vacuum import vacuum
from singerlake.lake import Lake
from singerlake.landing.writer import SchemaWriter
from singerlake.spark.session import OnDemand
from singerlake.tables import delta, delta_log
from singerlake.tables.heads import heads_key, read_heads
from singerlake.tables.project import project
from singerlake.times import now_ms
from support.lakes import TAP, record_msg
from support.storage import Counting

STREAM = "orders"
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "note": {"type": "string"}}}
KEY = delta.table_key(TAP, STREAM)


def land(lake: Lake, ids: range, note: str = "new") -> None:
    message = {"type": "SCHEMA", "stream": STREAM, "schema": SCHEMA, "key_properties": ["id"]}
    with SchemaWriter(lake, TAP, message) as writer:
        lines = [record_msg(STREAM, {"id": i, "note": f"{note} {i}"}) for i in ids]
        writer.commit([writer.write_file(lines, [now_ms()] * len(lines))])


def run(lake: Lake) -> dict:
    def no_spark():
        raise AssertionError("a one-task run of a local master starts no Spark")

    (result,) = project(lake, OnDemand(no_spark, "local[2]"), TAP, STREAM)
    return result


def leave_head_at(local_lake, version: int) -> None:
    """The heads as a run whose update was lost (or a hand) left them."""
    local_lake.storage.write(heads_key(TAP), json.dumps({"format": "singerlake-heads", "tables": {STREAM: version}}).encode())


def table_rows(local_lake) -> dict[int, str]:
    rows = DeltaTable(delta.table_uri(local_lake.storage, KEY)).to_pyarrow_table(columns=["id", "note"]).to_pylist()
    assert len(rows) == len({row["id"] for row in rows}), "one row per key"
    return {row["id"]: row["note"] for row in rows}


def test_an_incremental_run_plans_from_the_heads_without_listing_the_log(local_lake):
    lake = Lake(local_lake.storage)
    land(lake, range(0, 5))
    assert run(lake)["version"] == 0
    assert read_heads(local_lake.storage, TAP).tables == {STREAM: 0}
    land(lake, range(3, 8), "updated")

    counting = Counting(local_lake.storage)
    assert run(Lake(counting))["version"] == 1
    log_lists = [key for method, key in counting.calls if method.startswith("list") and "_delta_log" in key]
    assert log_lists == [], "the log is not listed"
    assert ("read", f"{KEY}/_delta_log/_last_checkpoint") not in counting.calls
    assert read_heads(local_lake.storage, TAP).tables == {STREAM: 1}
    assert table_rows(local_lake) == {i: f"{'updated' if i >= 3 else 'new'} {i}" for i in range(8)}


def test_a_run_planned_from_a_stale_head_plans_the_stream_again_and_loses_nothing(local_lake):
    lake = Lake(local_lake.storage)
    land(lake, range(0, 5))
    run(lake)
    land(lake, range(5, 10))
    run(lake)
    # A head left behind: another run committed version 1 and its heads update was lost.
    leave_head_at(local_lake, 0)
    land(lake, range(8, 12), "updated")

    result = run(lake)
    assert result["version"] == 2, "its first plan's commit found version 1 taken; planned again from the log, it committed 2"
    assert read_heads(local_lake.storage, TAP).tables == {STREAM: 2}
    assert table_rows(local_lake) == {i: f"{'updated' if i >= 8 else 'new'} {i}" for i in range(12)}


def test_a_head_naming_a_version_the_log_lacks_reads_the_log(local_lake):
    lake = Lake(local_lake.storage)
    land(lake, range(0, 3))
    run(lake)
    leave_head_at(local_lake, 40)
    land(lake, range(3, 6))
    assert run(lake)["version"] == 1
    assert read_heads(local_lake.storage, TAP).tables == {STREAM: 40}, "a head is only ever raised"
    assert sorted(table_rows(local_lake)) == list(range(6))


def test_vacuum_raises_the_head_past_its_fence(local_lake):
    lake = Lake(local_lake.storage)
    land(lake, range(0, 3))
    run(lake)
    land(lake, range(0, 3), "updated")  # the open tail is rewritten: its old files are no longer current
    run(lake)
    assert read_heads(local_lake.storage, TAP).tables == {STREAM: 1}
    deleted = vacuum(lake, retention_s=0, apply=True, force=True, now=now_ms() + 60_000)
    assert any(d.path.startswith(f"{KEY}/part-") for d in deleted), deleted
    assert read_heads(local_lake.storage, TAP).tables == {STREAM: 2}, "the fence commit is the table's head"

    land(lake, range(3, 5))
    counting = Counting(local_lake.storage)
    assert run(Lake(counting))["version"] == 3, "planned from the fence's version: committed at once"
    assert [key for method, key in counting.calls if method.startswith("list") and "_delta_log" in key] == []
    assert table_rows(local_lake) == {**{i: f"updated {i}" for i in range(3)}, 3: "new 3", 4: "new 4"}


def test_a_run_with_nothing_new_checks_its_head_is_still_the_tables(local_lake):
    lake = Lake(local_lake.storage)
    land(lake, range(0, 3))
    run(lake)
    assert delta.fence(local_lake.storage, KEY, delta.latest(local_lake.storage, KEY)), "another writer's version 1 (heads not raised)"
    counting = Counting(local_lake.storage)
    assert run(Lake(counting))["version"] == 1, "nothing new, and the table's head found past the stale one"
    assert read_heads(local_lake.storage, TAP).tables == {STREAM: 1}


def test_a_checkpoint_whose_committer_died_is_replaced_by_the_log_at_the_next_one(local_lake):
    """Planned from the heads, a commit due a checkpoint starts from the last one due; when that one is missing
    (its committer died before writing it) the log is replayed from the one before, and readers see every row."""
    lake = Lake(local_lake.storage)
    for number in range(6):  # versions 0..5: version 5 is due a checkpoint
        land(lake, range(number * 3, number * 3 + 3))
        run(lake)
    local_lake.storage.delete(delta_log.checkpoint_key(KEY, 5))  # as if its committer had died before writing it
    local_lake.storage.delete(f"{KEY}/_delta_log/_last_checkpoint")
    for number in range(6, 12):  # up to version 11, due the next checkpoint
        land(lake, range(number * 3, number * 3 + 3))
        assert run(lake)["version"] == number
    assert local_lake.storage.exists(delta_log.checkpoint_key(KEY, 11))
    assert delta_log.last_checkpoint(local_lake.storage, KEY) == 11
    assert sorted(table_rows(local_lake)) == list(range(36)), "read from the new checkpoint by delta-rs"
