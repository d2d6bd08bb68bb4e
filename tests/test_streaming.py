"""The `singerlake` streaming source (SPEC.md §12): `spark.readStream.format("singerlake")` on a
real local[2] Spark, to a Parquet sink with a checkpoint, while the target lands and compaction runs."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from singerlake import Lake
from singerlake.jobs.compact import compact_stream
from singerlake.jobs.repair import repair
from singerlake.sources import register
from singerlake.spark.session import spark_session
from support.lakes import TAP, LakeUnderTest, joined, land, local_lake_at, record_msg, schema_msg

STREAM = "events"
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "amount": {"type": "number"}, "note": {"type": ["string", "null"]}}}


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2]", "singerlake-tests")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    register(session)
    return session


@pytest.fixture
def lake(tmp_path) -> LakeUnderTest:
    (tmp_path / "lake").mkdir()
    return local_lake_at(tmp_path / "lake")


def land_events(lake: LakeUnderTest, ids: range, amount: float | None = None, batch_max_rows: int = 10) -> None:
    records = [record_msg(STREAM, {"id": i, "amount": i % 10 + 0.25 if amount is None else amount, "note": f"event {i}"}) for i in ids]
    land(lake.config, joined([schema_msg(STREAM, SCHEMA, ["id"]), *records]), batch_max_rows=batch_max_rows)


def streaming(spark, lake: LakeUnderTest, **options: str):
    reader = spark.readStream.format("singerlake").option("tap_id", TAP).option("stream", STREAM)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(lake.config["lake_root"])


def run_available_now(spark, lake: LakeUnderTest, sink: Path, checkpoint: Path, **options: str) -> list[int]:
    """Run the query with Trigger.AvailableNow until it stops; the records of each micro-batch that read any."""
    query = streaming(spark, lake, **options).writeStream.format("parquet").option("path", str(sink))
    query = query.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert not query.isActive
    return [progress["numInputRows"] for progress in query.recentProgress if progress["numInputRows"]]


def sink_rows(spark, sink: Path) -> list[tuple]:
    rows = spark.read.parquet(str(sink)).select("id", "amount", "_singerlake_commit", "_singerlake_index").collect()
    return sorted((row["id"], row["amount"], row["_singerlake_commit"], row["_singerlake_index"]) for row in rows)


def landed_rows(spark, lake: LakeUnderTest) -> list[tuple]:
    """What the batch source reads from the lake: every landed record with its position."""
    frame = spark.read.format("singerlake").option("tap_id", TAP).option("stream", STREAM).load(lake.config["lake_root"])
    rows = frame.select("id", "amount", "_singerlake_commit", "_singerlake_index").collect()
    return sorted((row["id"], row["amount"], row["_singerlake_commit"], row["_singerlake_index"]) for row in rows)


def test_a_query_restarted_from_its_checkpoint_sees_every_record_once_across_a_compaction(spark, lake, tmp_path):
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    land_events(lake, range(0, 50))
    frame = streaming(spark, lake)
    assert frame.isStreaming
    types = dict(frame.dtypes)  # typed as the batch source types them (SPEC.md §12)
    assert types["id"] == "bigint" and types["amount"] == "decimal(3,2)" and types["note"] == "string"
    assert types["_singerlake_commit"] == "bigint" and types["_singerlake_index"] == "bigint"

    query = frame.writeStream.format("parquet").option("path", str(sink)).option("checkpointLocation", str(checkpoint))
    query = query.trigger(processingTime="1 second").start()
    try:
        query.processAllAvailable()
        assert [row[0] for row in sink_rows(spark, sink)] == list(range(50))
        land_events(lake, range(50, 80))  # committed while the query runs
        query.processAllAvailable()
        assert [row[0] for row in sink_rows(spark, sink)] == list(range(80))
    finally:
        query.stop()

    land_events(lake, range(80, 100))
    files_before = len(lake.manifest(STREAM)["files"])
    compact_stream(Lake(lake.storage), spark, TAP, STREAM, target_bytes=1 << 20)
    assert len(lake.manifest(STREAM)["files"]) < files_before  # the unread records now sit in merged files

    # restarted from its checkpoint, in micro-batches that end inside the merged files
    assert run_available_now(spark, lake, sink, checkpoint, maxRecordsPerTrigger="7") == [7, 7, 6]
    land_events(lake, range(100, 110), batch_max_rows=4)
    assert run_available_now(spark, lake, sink, checkpoint, maxFilesPerTrigger="2") == [8, 2]

    rows = sink_rows(spark, sink)
    assert [row[0] for row in rows] == list(range(110))  # every record, none twice
    assert rows == landed_rows(spark, lake)  # with the positions and values the lake gives them
    assert rows[1][1] == Decimal("1.25")
    assert len({(commit, index) for _, _, commit, index in rows}) == 110


def test_a_rebuilt_manifest_stops_a_query_restarted_from_an_older_checkpoint(spark, lake, tmp_path):
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    land_events(lake, range(0, 20))
    run_available_now(spark, lake, sink, checkpoint)
    assert len(sink_rows(spark, sink)) == 20

    lake.storage.delete(Lake(lake.storage).paths(TAP, STREAM).manifest)
    repair(Lake(lake.storage), spark, apply=True)  # a new generation: commits are numbered anew
    land_events(lake, range(20, 30))

    query = streaming(spark, lake).writeStream.format("parquet").option("path", str(sink))
    query = query.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    with pytest.raises(Exception) as failed:
        query.awaitTermination(120)
    message = str(failed.value)
    assert f"stream {STREAM!r}" in message and "rebuilt" in message, message
    assert len(sink_rows(spark, sink)) == 20  # nothing read twice


def test_latest_starts_after_what_is_committed_and_a_wider_value_stops_the_query_naming_its_column(spark, lake, tmp_path):
    land_events(lake, range(0, 10))
    queries = {}
    for name, starting in (("earliest", "earliest"), ("latest", "latest")):
        frame = streaming(spark, lake, startingPosition=starting).writeStream.format("memory").queryName(name)
        queries[name] = frame.option("checkpointLocation", str(tmp_path / name)).trigger(processingTime="1 second").start()
    try:
        for query in queries.values():
            query.processAllAvailable()
        assert spark.table("earliest").count() == 10 and spark.table("latest").count() == 0
        land_events(lake, range(10, 15))
        for query in queries.values():
            query.processAllAvailable()
        assert sorted(row["id"] for row in spark.table("latest").collect()) == list(range(10, 15))
        assert sorted(row["id"] for row in spark.table("earliest").collect()) == list(range(15))

        land_events(lake, range(15, 16), amount=12345.678)  # the columns were fixed at start: amount decimal(3,2)
        with pytest.raises(Exception) as failed:
            queries["earliest"].processAllAvailable()
        assert "column 'amount'" in str(failed.value) and "restart the query" in str(failed.value)
        assert spark.table("earliest").count() == 15  # nothing cast, nothing nulled
    finally:
        for query in queries.values():
            query.stop()
    with pytest.raises(Exception, match="maxRecordsPerTrigger"):
        streaming(spark, lake, maxRecordsPerTrigger="0").writeStream.format("memory").queryName("refused").start().awaitTermination(60)
