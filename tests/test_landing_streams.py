"""Landing taps with many streams: one Spark job per batch, bounded storage requests, parallel fenced commits.

Real Spark (local[*], in-process; local-cluster through the CLI) and real HTTP S3 (moto, SeaweedFS). The
storage requests are counted by wrapping the lake's storage on the driver; executors get the
plain storage (the wrapper pickles as its inner storage), so what is counted is exactly the
driver's metadata traffic: locks, manifests, catalogue, singerlake.json.
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from contextlib import redirect_stdout

import pytest
from singerlake import Lake
from singerlake.commits.commit import register_writer
from singerlake.format.layout import StreamPaths, catalogue_key
from singerlake.format.scan import scan_stream
from singerlake.format.schema_hash import schema_hash
from singerlake.landing.errors import LandingError
from singerlake.times import iso_ms, now_ms
from support.lakes import TAP, LakeUnderTest, joined, record_msg, schema_msg, state_msg
from support.probes import CLUSTER, nearest_jvm, probed_env, writers
from support.storage import Counting
from support.target_runs import run_to_end
from target_singerlake.target import TargetSingerlake

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
# Streams per batch in the request-counting tests: several times any storage's commit pool (S3: 32 threads).
PARALLEL_STREAMS = 100


def stream_name(n: int) -> str:
    return f"public.table_{n:03d}"


def many_streams(streams: int, records_per_batch: int, batches: int) -> tuple[list[bytes], dict[str, list[bytes]]]:
    """SCHEMAs, then per batch a few records of every stream followed by a STATE."""
    lines = [schema_msg(stream_name(n), SCHEMA, ["id"]) for n in range(streams)]
    sent: dict[str, list[bytes]] = {stream_name(n): [] for n in range(streams)}
    for batch in range(batches):
        for n in range(streams):
            for i in range(records_per_batch):
                record = record_msg(stream_name(n), {"id": batch * 1000 + i, "name": f"row {i} ü"}, "2024-03-01T00:00:00.000Z")
                lines.append(record)
                sent[stream_name(n)].append(record)
        lines.append(state_msg({"batch": batch + 1}))
    return lines, sent


def cut_at_each_state(lake: LakeUnderTest, rows: int | None = None, **settings) -> TargetSingerlake:
    """A target whose batches end at each STATE, with leases long enough that no lock refresh runs meanwhile.

    ``rows``: each STATE follows that many records; batches are cut by that count (a STATE alone then
    follows as a batch of no records). Without it by an age of 0, which also cuts wherever the reader
    is when the age watch ticks (mid-batch on a loaded machine): only for tests that a cut mid-batch
    leaves true."""
    cut = {"batch_max_rows": rows} if rows else {"max_batch_age_seconds": 0}
    return TargetSingerlake(config={**lake.config, **cut, "lock_lease_seconds": 600, **settings})


def listen(target: TargetSingerlake, lines: list[bytes]) -> list[str]:
    out = io.StringIO()
    with redirect_stdout(out):
        target.listen(file_input=io.BytesIO(joined(lines)))
    return [line for line in out.getvalue().splitlines() if line]


def test_a_batch_of_many_streams_is_written_by_one_spark_job(local_lake):
    lines, sent = many_streams(streams=60, records_per_batch=3, batches=3)
    target = cut_at_each_state(local_lake, rows=60 * 3)
    states = listen(target, lines)

    assert [json.loads(state)["batch"] for state in states] == [1, 2, 3]
    work_id = target.lander.settings.work_id
    for stream, records in sent.items():
        assert local_lake.stored(stream) == [record.rstrip(b"\n") for record in records]
        manifest = local_lake.manifest(stream)
        assert manifest["commits"] == 3  # one commit per batch
        # committed by this run, never adopted by the scan that seeds a stream's first manifest (work_id null)
        assert {entry["work_id"] for entry in manifest["files"]} == {work_id}
    tracker = target.spark().sparkContext.statusTracker()
    drain = target.lander.drain
    jobs = [tracker.getJobIdsForGroup(drain.job_group(batch)) for batch in range(1, 8)]
    assert [len(ids) for ids in jobs] == [1, 0] * 3 + [0], "each batch of 60 streams is one Spark job; its STATE alone, none"


def count_requests(target: TargetSingerlake) -> tuple[Counting, list[int]]:
    """Count the target's storage requests, and mark how many were made when each STATE went out."""
    counting = Counting(target.lake.storage)
    target.lake.storage = counting
    marks: list[int] = []
    emit = target.lander.drain.emit_state

    def mark_and_emit(state: bytes) -> None:
        marks.append(len(counting.requests))
        emit(state)

    target.lander.drain.emit_state = mark_and_emit
    return counting, marks


def test_a_warm_batch_costs_one_storage_request_per_stream(lake):
    """Second batch on 100 streams whose writers are registered: one conditional write of each manifest,
    against the version the writer wrote last (no read: nobody else wrote since), nothing else.
    (A third, the last, follows: the last batch also releases each stream's lock once committed.)
    100 streams: three times the commit pool of S3 storage (32 threads), so commits still queue on it."""
    streams = PARALLEL_STREAMS
    lines, sent = many_streams(streams=streams, records_per_batch=2, batches=3)
    # By row count: cut mid-batch by the age watch, a new tap's first catalogue read the manifests of
    # the streams opened but not committed yet.
    target = cut_at_each_state(lake, rows=streams * 2)
    counting, marks = count_requests(target)
    states = listen(target, lines)

    assert len(states) == 3 and len(marks) == 3
    manifests = {StreamPaths(TAP, stream_name(n)).manifest for n in range(streams)}
    first_reads = [key for method, key in counting.requests[: marks[0]] if method == "read" and key in manifests]
    assert len(first_reads) == 1, "batch 1 reads one manifest: the run's first, which finds none; its listing shows the others new"
    second = counting.requests[marks[0] : marks[1]]
    by_kind = Counter(method for method, _ in second)
    assert by_kind == {"write": streams}, by_kind
    assert Counter(key for _, key in second) == {key: 1 for key in manifests}, "only manifests: no catalogue, lock or root I/O"
    last = Counter((method, kind_of(key)) for method, key in counting.requests[marks[1] :])
    assert last == {("write", "manifest.json"): streams, ("delete", "singerlake.lock"): streams}, last
    for stream, records in sent.items():
        assert lake.stored(stream) == [record.rstrip(b"\n") for record in records]
    catalogue = lake.json(catalogue_key(TAP))
    assert sorted(entry["tap_stream_id"] for entry in catalogue["streams"]) == sorted(sent)


def kind_of(key: str) -> str:
    return key.rsplit("/", 1)[-1] if key.endswith((".lock", ".json")) else key


def test_a_first_batch_on_new_streams_costs_four_storage_requests_per_stream(lake):
    """First batch of a new tap on 100 new streams (SPEC.md §10): per stream a create-only lock, a
    create-only manifest (its writer registered: no read, no scan), the commit (If-Match) and the
    lock's release (in the last batch, as soon as the stream is committed); per run the first open's
    read of its manifest (none) and the listing of the tap's streams that tells the others they are
    new, and the catalogue and singerlake.json (read, rebuilt from a listing since neither exists yet,
    written). Data files are written by executors (or, when the input ended before Spark began to start, by the driver)."""
    streams = PARALLEL_STREAMS
    lines, sent = many_streams(streams=streams, records_per_batch=2, batches=1)
    target = cut_at_each_state(lake, max_batch_age_seconds=300)  # one batch, cut by the end of input: the last
    counting, marks = count_requests(target)
    assert len(listen(target, lines)) == 1

    data = [key for _, key in counting.requests if key.endswith(".singer.gz")]  # written here when Spark had not begun to start
    by_request = Counter((method, kind_of(key)) for method, key in counting.requests if not key.endswith(".singer.gz"))
    assert by_request == {
        ("read", "manifest.json"): 1,  # the run's first open: none, so it lists the tap's streams
        ("list_dirs", f"raw/{TAP}/"): 2,  # the run's listing of the tap's streams; the catalogue's rebuild
        ("list_dirs", "raw/"): 1,  # singerlake.json's rebuild
        ("write", "singerlake.lock"): streams,
        ("write", "manifest.json"): 2 * streams,  # creation (create-only, the writer registered), commit
        ("delete", "singerlake.lock"): streams,
        ("read", "catalogue.json"): 1,
        ("write", "catalogue.json"): 1,
        ("read", "singerlake.json"): 1,
        ("write", "singerlake.json"): 1,
    }, by_request
    assert len(counting.requests) - len(data) == 4 * streams + 8
    assert counting.requests[marks[0] :] == [], "the last batch released each lock once its stream was committed, before the STATE"
    for stream, records in sent.items():
        assert lake.stored(stream) == [record.rstrip(b"\n") for record in records]
        assert {entry["work_id"] for entry in lake.manifest(stream)["files"]} == {target.lander.settings.work_id}
    assert lake.locks() == []


def test_a_run_whose_input_ends_before_spark_starts_is_written_by_the_driver(local_lake, monkeypatch):
    """SPEC.md §10: with a Spark of this machine, a run whose input ended before Spark began to start is one batch
    the driver writes itself (the same files and metadata); no Spark session is started. Cut into batches, Spark runs."""
    import target_singerlake.target

    monkeypatch.setattr(target_singerlake.target, "LOCAL_START_DEFER_S", 600)  # Spark begins only when a batch asks for it
    lines, sent = many_streams(streams=3, records_per_batch=2, batches=1)
    target = cut_at_each_state(local_lake, max_batch_age_seconds=300)
    assert len(listen(target, lines)) == 1
    assert target.spark.started() is None, "no Spark session was started"
    for stream, records in sent.items():
        assert local_lake.stored(stream) == [record.rstrip(b"\n") for record in records]
        assert [entry["records"] for entry in local_lake.manifest(stream)["files"]] == [2]

    lines, sent = many_streams(streams=3, records_per_batch=2, batches=2)  # the first batch is cut before the input ends
    target = cut_at_each_state(local_lake, rows=6, max_batch_age_seconds=300)
    assert len(listen(target, lines)) == 2
    assert target.spark.started() is not None, "a run of several batches runs them on Spark"


def test_a_stream_with_data_but_no_manifest_is_seeded_from_a_scan_not_taken_for_new(local_lake):
    """A stream whose directory holds data files but no manifest (a lake copied without its metadata,
    a manifest deleted to be rebuilt) is not new: its first manifest still comes from the scan (SPEC.md §7)."""
    old, new = stream_name(1), stream_name(2)
    assert len(listen(cut_at_each_state(local_lake), many_streams(streams=2, records_per_batch=2, batches=1)[0])) == 1
    local_lake.storage.delete(StreamPaths(TAP, old).manifest)
    lines = [schema_msg(old, SCHEMA, ["id"]), schema_msg(new, SCHEMA, ["id"])]
    lines += [record_msg(name, {"id": 500, "name": "later"}) for name in (old, new)] + [state_msg({"batch": 2})]
    target = cut_at_each_state(local_lake)
    counting = Counting(target.lake.storage)
    target.lake.storage = counting
    assert len(listen(target, lines)) == 1

    manifest_reads = Counter(key for method, key in counting.requests if method == "read" and key.endswith("manifest.json"))
    assert manifest_reads == {StreamPaths(TAP, old).manifest: 1}, "only the stream the listing showed is read (404), then scanned"
    assert [json.loads(line)["record"]["id"] for line in local_lake.stored(old)] == [0, 1, 500], "the scan adopted the files"
    assert [json.loads(line)["record"]["id"] for line in local_lake.stored(new)] == [500]


def test_parallel_commits_still_reject_a_fenced_out_writer(lake):
    """Another writer takes one stream's lock over and registers between two batches: that stream's commit
    is refused, its files stay invisible, and the STATE of the batch is not emitted; the other streams
    commit side by side."""
    lines, sent = many_streams(streams=24, records_per_batch=2, batches=2)
    target = cut_at_each_state(lake, rows=24 * 2)
    victim = stream_name(7)
    emit = target.lander.drain.emit_state

    def intrude_after_first(state: bytes) -> None:
        emit(state)
        if json.loads(state)["batch"] == 1:  # the intruder takes the victim's lock over and registers, as a taker does
            paths, digest = StreamPaths(TAP, victim), schema_hash(SCHEMA, ["id"])
            body = {"writer-id": "writer-intruder", "acquired": iso_ms(now_ms()), "refreshed": iso_ms(now_ms()), "lease_seconds": 600}
            lake.storage.write(paths.lock(digest), json.dumps(body).encode())
            register_writer(lake.storage, paths, digest, "writer-intruder")

    target.lander.drain.emit_state = intrude_after_first
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(LandingError, match=re.escape(repr(victim)) + r".*lost its lock to writer-intruder"):
        target.listen(file_input=io.BytesIO(joined(lines)))

    assert [json.loads(line)["batch"] for line in out.getvalue().splitlines() if line] == [1]
    assert lake.stored(victim) == [record.rstrip(b"\n") for record in sent[victim][:2]], "only the first batch is visible"
    for stream, records in sent.items():
        if stream != victim:
            assert lake.stored(stream) == [record.rstrip(b"\n") for record in records]
    assert lake.locks() == [StreamPaths(TAP, victim).lock(schema_hash(SCHEMA, ["id"]))], "the intruder's lock is left to it"


WIDE = {"type": "object", "properties": {**SCHEMA["properties"], "extra": {"type": "string"}}}


def _catalogued_version(lake: LakeUnderTest, stream: str) -> str:
    (entry,) = [e for e in lake.json(catalogue_key(TAP))["streams"] if e["tap_stream_id"] == stream]
    return entry["metadata"][0]["metadata"]["singerlake-version"]


def test_a_run_that_changes_no_catalogue_entry_reads_no_catalogue_and_one_that_does_writes_it(local_lake):
    """The catalogue holds the entry of the manifest a writer reads (SPEC.md §9): a run whose commits
    leave the stream's entry as it was neither reads nor writes it; a new schema version writes it."""
    stream = stream_name(0)
    first = [schema_msg(stream, SCHEMA, ["id"]), record_msg(stream, {"id": 1}), state_msg({"n": 1})]
    assert len(listen(cut_at_each_state(local_lake), first)) == 1
    target = cut_at_each_state(local_lake)
    counting = Counting(target.lake.storage)
    target.lake.storage = counting
    assert len(listen(target, [schema_msg(stream, SCHEMA, ["id"]), record_msg(stream, {"id": 2}), state_msg({"n": 2})])) == 1
    touched = {key for _, key in counting.requests}
    assert catalogue_key(TAP) not in touched and "raw/singerlake.json" not in touched, sorted(touched)

    target = cut_at_each_state(local_lake)
    counting = Counting(target.lake.storage)
    target.lake.storage = counting
    assert len(listen(target, [schema_msg(stream, WIDE, ["id"]), record_msg(stream, {"id": 3, "extra": "e"}), state_msg({"n": 3})])) == 1
    assert Counter(method for method, key in counting.requests if key == catalogue_key(TAP)) == {"read": 1, "write": 1}
    assert _catalogued_version(local_lake, stream) == "v2"


def _crashed_after_commit(lake: LakeUnderTest, stream: str) -> str:
    """A writer that committed a new schema version and died before writing the catalogue: its lock is
    left, stale; returns the lock's key."""
    from singerlake.landing.writer import SchemaWriter

    writer = SchemaWriter(Lake(lake.storage), TAP, json.loads(schema_msg(stream, WIDE, ["id"])), lease_s=1, drift_s=0.5)
    writer.open()
    writer.commit([writer.write_file([record_msg(stream, {"id": 9, "extra": "x"})], [now_ms()])], publish=False)
    writer.lock.abandon()
    return writer.lock.key


def test_a_writer_that_takes_a_stale_lock_over_writes_the_catalogue_entry_its_holder_did_not(local_lake):
    stream = stream_name(0)
    assert len(listen(cut_at_each_state(local_lake), [schema_msg(stream, SCHEMA, ["id"]), record_msg(stream, {"id": 1})])) == 0
    lock = _crashed_after_commit(local_lake, stream)
    assert _catalogued_version(local_lake, stream) == "v1", "the dead writer's v2 is committed, not catalogued"

    target = cut_at_each_state(local_lake, lock_lease_seconds=1, lock_drift_seconds=0.5)
    assert len(listen(target, [schema_msg(stream, WIDE, ["id"]), record_msg(stream, {"id": 2, "extra": "e"}), state_msg({"n": 2})])) == 1
    assert _catalogued_version(local_lake, stream) == "v2"
    assert lock not in local_lake.locks()


def test_a_lock_whose_catalogue_entry_could_not_be_written_is_left_to_go_stale(local_lake, monkeypatch):
    """The entry of a new stream cannot be written: the run fails without the batch's STATE and leaves the
    stream's lock (never released, no longer refreshed); the next run takes it over and writes the entry."""
    stream = stream_name(0)
    lines = [schema_msg(stream, SCHEMA, ["id"]), record_msg(stream, {"id": 1}), state_msg({"n": 1})]
    target = cut_at_each_state(local_lake, lock_lease_seconds=1, lock_drift_seconds=0.5)

    def unwritable(*args, **kwargs):
        raise OSError("the catalogue's disk is full")

    monkeypatch.setattr(target.lake, "publish_catalogue", unwritable)
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(LandingError, match="disk is full"):
        target.listen(file_input=io.BytesIO(joined(lines)))
    assert out.getvalue() == "", "no STATE"
    (lock,) = local_lake.locks()
    assert [json.loads(line)["record"]["id"] for line in local_lake.stored(stream)] == [1], "committed, not catalogued"

    assert len(listen(cut_at_each_state(local_lake, lock_lease_seconds=1, lock_drift_seconds=0.5), lines)) == 1
    assert _catalogued_version(local_lake, stream) == "v1"
    assert local_lake.locks() == []


@pytest.mark.heavy
def test_local_cluster_lands_many_streams_one_job_per_batch_written_by_executors(tmp_path):
    lines, sent = many_streams(streams=40, records_per_batch=5, batches=2)
    root = tmp_path / "lake"
    config = tmp_path / "config.json"
    # Batches cut by their row count (each STATE follows 200 records), not by the clock: an age of 0 cut
    # wherever the reader happened to be when the age watch ticked, on a loaded machine mid-batch.
    settings = {"lake_root": str(root), "tap_id": TAP, "spark_master": CLUSTER, "batch_max_rows": 200}
    config.write_text(json.dumps(settings))
    env, log = probed_env(tmp_path)
    run = run_to_end(config, [line + b"\n" for line in lines], tmp_path, "many-streams", env)

    assert run.states() == [{"batch": 1}, {"batch": 2}]
    reports = re.findall(r"batch \d+: (\d+) records of (\d+) stream\(s\) in \d+ file\(s\) by (\S+) Spark job", run.stderr)
    with_records = [report for report in reports if report[0] != "0"]  # a STATE alone makes a batch of no records
    assert with_records == [("200", "40", "1"), ("200", "40", "1")], run.stderr[-3000:]
    lake = Lake.open(str(root))
    written = writers(log)
    for stream, records in sent.items():
        manifest = lake.manifest(TAP, stream)
        assert manifest.commits == 2 and sum(entry["records"] for entry in manifest.files) == len(records)
        for entry in manifest.files:
            assert "CoarseGrainedExecutorBackend" in nearest_jvm(written[entry["path"]])["cmdline"]


def test_file_ids_follow_record_order_so_a_rebuild_replays_the_same(local_lake):
    """Batches whose two segments (a schema change) are written by two Spark tasks at once: ids still
    ascend in commit order, so the scan a rebuild starts from (ordered by id) gives the same files,
    versions and record order."""
    stream = stream_name(0)
    wide = {"type": "object", "properties": {**SCHEMA["properties"], "extra": {"type": "string"}}}
    lines = []
    for batch in range(8):
        for schema in (SCHEMA, wide):
            lines.append(schema_msg(stream, schema, ["id"]))
            lines += [record_msg(stream, {"id": batch * 100 + i, "name": "n", "extra": "e"}) for i in range(3)]
        lines.append(state_msg({"batch": batch}))
    assert len(listen(cut_at_each_state(local_lake, rows=6), lines)) == 8

    paths = StreamPaths(TAP, stream)
    manifest = Lake.open(local_lake.config["lake_root"]).manifest(TAP, stream)
    ids = [entry["id"] for entry in manifest.files]
    assert len(ids) == 16 and ids == sorted(ids), "file ids ascend in commit order"
    rebuilt = scan_stream(local_lake.storage, paths)
    assert [entry["id"] for entry in rebuilt.files] == ids
    assert {h: v["version"] for h, v in rebuilt.versions.items()} == {h: v["version"] for h, v in manifest.versions.items()}
