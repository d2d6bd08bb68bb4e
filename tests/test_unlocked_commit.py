"""A run's only commit of a stream-schema goes without the lock while none exists (SPEC.md §9), and keeps
what the lock promises: it never lands inside another writer's run, it waits for a held lock, a stale
one is taken over as before, and a commit that changes the catalogue entry takes the lock.

Real Spark (local[*], in-process) on every backend of the ``lake`` fixture or on a local lake.
"""

from __future__ import annotations

import json
import threading

from singerlake import Lake
from singerlake.landing.writer import SchemaWriter
from singerlake.times import now_ms
from support.lakes import TAP, LakeUnderTest, record_msg, schema_msg, state_msg
from target_singerlake.target import TargetSingerlake
from test_landing_streams import listen

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
WIDE = {"type": "object", "properties": {**SCHEMA["properties"], "extra": {"type": "string"}}}
STREAM = "users"


def target(lake: LakeUnderTest, **settings) -> TargetSingerlake:
    """Batches as large as the default: a run's input ends before its batch is full."""
    return TargetSingerlake(config={**lake.config, "lock_lease_seconds": 600, **settings})


def run_lines(ids: list[int], schema: dict = SCHEMA, state: int = 1) -> list[bytes]:
    return [schema_msg(STREAM, schema, ["id"]), *(record_msg(STREAM, {"id": i}) for i in ids), state_msg({"n": state})]


def ids_in_commit_order(lake: LakeUnderTest) -> list[int]:
    return [json.loads(line)["record"]["id"] for line in lake.stored(STREAM)]


def watch_takes(monkeypatch) -> list[str]:
    """The streams whose writers take their lock, in order."""
    taken: list[str] = []
    original = SchemaWriter.take

    def take(self):
        taken.append(self.stream)
        return original(self)

    monkeypatch.setattr(SchemaWriter, "take", take)
    return taken


def holder(lake: LakeUnderTest, **lock) -> SchemaWriter:
    """Another writer of the stream-schema, holding its lock."""
    return SchemaWriter(Lake(lake.storage), TAP, json.loads(schema_msg(STREAM, SCHEMA, ["id"])), **lock).open()


def commit_record(writer: SchemaWriter, record_id: int) -> None:
    writer.commit([writer.write_file([record_msg(STREAM, {"id": record_id})], [now_ms()])], publish=False)


def test_a_warm_single_batch_run_takes_no_lock_but_a_new_schema_version_or_several_batches_do(local_lake, monkeypatch):
    assert listen(target(local_lake), run_lines([1])) == ['{"n": 1}']  # the stream's first run creates its manifest, locked
    taken = watch_takes(monkeypatch)

    assert listen(target(local_lake), run_lines([2], state=2)) == ['{"n": 2}']
    assert taken == [], "one commit, the catalogue entry unchanged, no lock anywhere: none taken"
    assert listen(target(local_lake), run_lines([3], WIDE, state=3)) == ['{"n": 3}']
    assert taken == [STREAM], "a new schema version changes the catalogue entry: under the lock"
    assert listen(target(local_lake, batch_max_rows=1), run_lines([4, 5], state=4)) == ['{"n": 4}']
    assert taken == [STREAM, STREAM], "a run of several batches takes the lock at its first"

    assert ids_in_commit_order(local_lake) == [1, 2, 3, 4, 5]
    assert local_lake.locks() == []
    (entry,) = local_lake.json(f"raw/{TAP}/catalogue.json")["streams"]
    assert entry["metadata"][0]["metadata"]["singerlake-version"] == "v2", "the catalogue holds the latest version"


def test_the_only_commit_waits_for_a_held_lock_and_never_lands_inside_its_holders_run(lake, monkeypatch):
    assert listen(target(lake), run_lines([1])) == ['{"n": 1}']
    other = holder(lake)
    commit_record(other, 100)  # the holder's run has committed once, and goes on
    reached = threading.Event()
    original = SchemaWriter.take

    def take(self):
        reached.set()  # the run found the lock and waits to take it
        return original(self)

    monkeypatch.setattr(SchemaWriter, "take", take)
    outcome: dict = {}
    run = threading.Thread(target=lambda: outcome.update(states=listen(target(lake), run_lines([200], state=2))))
    run.start()
    try:
        assert reached.wait(90), "the run's commit saw the held lock"
        commit_record(other, 101)  # the holder's run goes on while the other run waits
    finally:
        other.close()
        run.join(90)
    assert outcome["states"] == ['{"n": 2}']
    assert ids_in_commit_order(lake) == [1, 100, 101, 200], "the waiting run's records after all of the holder's"
    assert lake.locks() == []


def test_a_stale_lock_is_taken_over_by_the_only_commit_which_registers(local_lake):
    assert listen(target(local_lake), run_lines([1])) == ['{"n": 1}']
    dead = holder(local_lake, lease_s=1, drift_s=0.5)
    dead.lock.abandon()  # a writer that died holding the lock
    assert listen(target(local_lake, lock_lease_seconds=1, lock_drift_seconds=0.5), run_lines([2], state=2)) == ['{"n": 2}']
    assert ids_in_commit_order(local_lake) == [1, 2]
    assert local_lake.locks() == []
    (registered,) = local_lake.manifest(STREAM)["writers"].values()
    assert registered["writer_id"] > dead.lock.writer_id, "the taker registered above the dead holder: it is fenced out"
