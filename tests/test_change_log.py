"""The change log (SPEC.md §16): each landing names the streams it committed, before the STATE that covers
them, and `project` visits only the streams named since its last run (every stream once a day, or when
asked for something else). Landing through the real target (in-process, Spark local); project through
the core with storage calls counted (on S3 at 1,000 streams: test_change_log_views.py)."""

from __future__ import annotations

import io
import json
import shutil
from collections import Counter
from contextlib import redirect_stdout
from pathlib import Path

from singerlake.changes import WALK_MS, log_prefix
from singerlake.jobs.vacuum import vacuum
from singerlake.lake import Lake
from singerlake.spark.session import OnDemand
from singerlake.storage import LocalStorage
from singerlake.tables.heads import heads_key
from singerlake.tables.project import project
from singerlake.times import file_id_ms, new_file_id, now_ms
from support.lakes import NOTES, TAP, joined, land, local_lake_at, notes_landing, record_msg, schema_msg, state_msg
from support.storage import Counting
from target_singerlake.target import TargetSingerlake


def no_spark():
    raise AssertionError("one-task runs of a local master start no Spark")


SPARK = OnDemand(no_spark, "local[2]")


def markers(storage) -> list[dict]:
    return [json.loads(storage.read(info.key).data) for info in storage.list(log_prefix(TAP))]


def manifests_read(counting: Counting) -> list[str]:
    return sorted(key.split("/")[-2] for method, key in counting.requests if method == "read" and key.endswith("/manifest.json"))


def stream_reads(counting: Counting) -> set[str]:
    """The streams whose objects the run touched (raw, staging or published, anything below a stream)."""
    found = set()
    for _, key in counting.requests:
        parts = key.split("/")
        if parts[0] in ("raw", "staging", "published") and len(parts) > 3:
            found.add(parts[2])
    return found


def named_by(doc: dict) -> tuple[str, list[str]]:
    return ("open", doc["running"]) if "running" in doc else ("closed" if "run" in doc else "plain", doc["streams"])


def test_a_landing_names_its_streams_before_the_state_that_covers_them(tmp_path):
    lake = local_lake_at(tmp_path)
    target = TargetSingerlake(config={**lake.config, "batch_max_rows": 10})
    seen_at_state = []
    emit = target.lander.drain.emit_state

    def emit_and_look(state: bytes) -> None:
        seen_at_state.append([named_by(doc) for doc in markers(lake.storage)])
        emit(state)

    target.lander.drain.emit_state = emit_and_look
    lines = [schema_msg(s, NOTES, ["id"]) for s in ("a", "b")]
    lines += [record_msg("a", {"id": i}) for i in range(10)] + [state_msg({"n": 1})]  # batch 1: a
    lines += [record_msg("b", {"id": i}) for i in range(10)] + [state_msg({"n": 2})]  # batch 2: b, new to the run
    lines += [record_msg("a", {"id": i}) for i in range(10, 20)] + [state_msg({"n": 3})]  # batch 3: a again
    lines += [record_msg("b", {"id": i}) for i in range(10, 15)] + [state_msg({"n": 4})]  # the last batch
    with redirect_stdout(io.StringIO()):
        target.listen(file_input=io.BytesIO(joined(lines)))
    opened = [("open", ["a"])]
    both = [*opened, ("open", ["a", "b"])]
    assert seen_at_state == [opened, both, both, [*both, ("closed", ["a", "b"])]], (
        "each STATE went out after a marker naming what it covers; a batch of streams already named wrote none"
    )
    docs = markers(lake.storage)
    assert {doc["tap_id"] for doc in docs} == {TAP} and len({doc["run"] for doc in docs}) == 1


def test_a_run_of_one_batch_writes_only_its_closing_marker(tmp_path):
    lake = local_lake_at(tmp_path)
    land(lake.config, notes_landing(["a", "b"]))
    assert [named_by(doc) for doc in markers(lake.storage)] == [("closed", ["a", "b"])]


def test_project_follows_an_open_run_until_it_closes(tmp_path):
    """A run that goes on committing after its open marker is visited at every project until its closing marker."""
    from singerlake.changes import Unmarked

    streams = [f"s{n}" for n in range(4)]
    lake = local_lake_at(tmp_path)
    land(lake.config, notes_landing(streams))
    counting = Counting(LocalStorage(lake.config["lake_root"]))
    reader = Lake(counting)
    project(reader, SPARK)
    run = Unmarked(lake.storage, TAP)
    run.add("s1")
    run.mark()  # an open marker naming s1, as a landing run's first STATE batch writes
    for _ in range(3):  # the run commits s1 again and again, with no further marker
        counting.clear()
        project(reader, SPARK)
        assert manifests_read(counting) == ["s1"]
    run.add("s1")
    run.mark(final=True)
    counting.clear()
    project(reader, SPARK)
    assert manifests_read(counting) == ["s1"], "the closing marker: visited once more"
    counting.clear()
    project(reader, SPARK)
    assert manifests_read(counting) == [], "closed: no longer followed"


def test_a_run_that_stops_without_closing_is_followed_for_its_lease_then_dropped(tmp_path, monkeypatch):
    import singerlake.changes as changes

    lake = local_lake_at(tmp_path)
    land(lake.config, notes_landing(["s0", "s1", "s2"]))
    run = changes.Unmarked(lake.storage, TAP)
    run.add("s1")
    run.mark()  # the run is killed after this: no closing marker ever comes
    counting = Counting(LocalStorage(lake.config["lake_root"]))
    reader = Lake(counting)
    assert len(project(reader, SPARK)) == 3, "no place yet: every stream"
    counting.clear()
    project(reader, SPARK)
    assert manifests_read(counting) == ["s1"], "a full visit read the open marker and follows the run"
    later = now_ms() + changes.LEASE_MS + changes.MARGIN_MS + 60_000
    monkeypatch.setattr(changes, "now_ms", lambda: later)
    counting.clear()
    project(reader, SPARK)
    assert manifests_read(counting) == ["s1"], "its lease passed: visited once more"
    counting.clear()
    project(reader, SPARK)
    assert manifests_read(counting) == [], "then no longer followed"


def test_project_visits_only_the_streams_named_since_its_last_run(tmp_path):
    streams = [f"s{n:02d}" for n in range(12)]
    lake = local_lake_at(tmp_path)
    land(lake.config, notes_landing(streams))
    counting = Counting(LocalStorage(lake.config["lake_root"]))
    reader = Lake(counting)
    assert len(project(reader, SPARK)) == 12  # no place yet: every stream

    counting.clear()
    assert project(reader, SPARK) == []
    assert stream_reads(counting) == set(), "a run with nothing new visits no stream"
    assert Counter(method for method, _ in counting.requests) <= Counter({"root_exists": 1, "read": 2, "list": 1}), counting.requests

    land(lake.config, notes_landing(["s03", "s07"], first_id=5))
    counting.clear()
    results = project(reader, SPARK)
    assert sorted((r["stream"], r["rows"]) for r in results) == [("s03", 10), ("s07", 10)]
    assert manifests_read(counting) == ["s03", "s07"] and stream_reads(counting) == {"s03", "s07"}

    counting.clear()
    assert project(reader, SPARK) == [] and stream_reads(counting) == set()


def projected_then_landed(tmp_path) -> tuple:
    """Streams a and b landed and projected, then b landed again: (the lake, a reader of it)."""
    lake = local_lake_at(tmp_path)
    land(lake.config, notes_landing(["a", "b"]))
    reader = Lake(LocalStorage(lake.config["lake_root"]))
    project(reader, SPARK)
    land(lake.config, notes_landing(["b"], first_id=5))
    return lake, reader


def test_a_commit_no_marker_names_is_found_by_the_daily_visit(tmp_path):
    lake, reader = projected_then_landed(tmp_path)
    shutil.rmtree(Path(lake.config["lake_root"]) / log_prefix(TAP))  # as if its writer died before its marker
    assert project(reader, SPARK) == [], "not named: not visited"

    heads = json.loads(reader.storage.read(heads_key(TAP)).data)
    heads["changes"]["walked"] -= WALK_MS + 1  # the last visit of every stream is a day old
    reader.storage.write(heads_key(TAP), json.dumps(heads).encode())
    results = project(reader, SPARK)
    assert {r["stream"]: r["rows"] for r in results} == {"a": 5, "b": 10}


def test_a_run_asked_for_something_else_visits_every_stream(tmp_path):
    lake = local_lake_at(tmp_path)
    land(lake.config, notes_landing(["a", "b"]))
    reader = Lake(LocalStorage(lake.config["lake_root"]))
    project(reader, SPARK)
    assert {r["stream"] for r in project(reader, SPARK, hard_delete=True)} == {"a", "b"}
    assert project(reader, SPARK, hard_delete=True) == []
    assert [r["stream"] for r in project(reader, SPARK, TAP, "a")] == ["a"], "a named stream is always visited"


def test_vacuum_deletes_markers_older_than_two_days_and_the_retention(tmp_path):
    lake = local_lake_at(tmp_path)
    land(lake.config, notes_landing(["a"]))
    storage = lake.storage
    day = 24 * 3600 * 1000
    for age_days in (3, 1):
        key = f"{log_prefix(TAP)}{new_file_id(now_ms() - age_days * day)}.json"
        storage.write(key, json.dumps({"format": "singerlake-changes", "tap_id": TAP, "streams": ["a"]}).encode())
    ages = sorted((now_ms() - file_id_ms(info.key.rsplit("/", 1)[1])) // day for info in storage.list(log_prefix(TAP)))
    assert ages == [0, 1, 3]
    reader = Lake(LocalStorage(lake.config["lake_root"]))
    assert [d.reason for d in vacuum(reader, retention_s=3600) if "change marker" in d.reason] == ["change marker older than the retention"]
    assert len(list(storage.list(log_prefix(TAP)))) == 3, "a dry run deletes nothing"
    vacuum(reader, retention_s=3600, apply=True)
    ages = sorted((now_ms() - file_id_ms(info.key.rsplit("/", 1)[1])) // day for info in storage.list(log_prefix(TAP)))
    assert ages == [0, 1]
    assert len([d for d in vacuum(reader, retention_s=12 * 3600) if "change marker" in d.reason]) == 0


def test_a_stream_that_failed_is_visited_again_without_a_new_marker(tmp_path):
    lake, reader = projected_then_landed(tmp_path)
    root = lake.storage.read(f"raw/{TAP}/b/manifest.json").data
    lake.storage.write(f"raw/{TAP}/b/manifest.json", b"{not json")
    failures: list = []
    assert project(reader, SPARK, failures=failures) == [] and [f.stream for f in failures] == ["b"]
    lake.storage.write(f"raw/{TAP}/b/manifest.json", root)
    assert [(r["stream"], r["rows"]) for r in project(reader, SPARK)] == [("b", 10)]
    assert project(reader, SPARK) == []


def test_a_marker_that_cannot_be_read_makes_the_run_visit_every_stream(tmp_path):
    lake, reader = projected_then_landed(tmp_path)
    lake.storage.write(f"{log_prefix(TAP)}{new_file_id()}.json", b'["not", "a marker"]')
    assert {r["stream"]: r["rows"] for r in project(reader, SPARK)} == {"a": 5, "b": 10}
    assert project(reader, SPARK) == [], "the place moved past it"
