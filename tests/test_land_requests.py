"""The request budget of landing (SPEC.md §10), counted at the HTTP level: target-singerlake on real Spark
(in-process, local[*]: its executors' Python workers are processes of their own) against moto and SeaweedFS
behind the counting proxy (support/s3_counter.py), which sees every request of every process.

Each case counts a whole run, from the target's construction to its end: a cold run (a new lake, on a
machine that never probed it), a warm stream in a new run, each further batch of a run, and a warm run
of a full-table sync (ACTIVATE_VERSION first). What a test reads back to check the lake goes to the
server directly, uncounted.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from contextlib import redirect_stdout

import pytest
from singerlake import Lake
from singerlake.format.layout import StreamPaths, catalogue_key
from singerlake.format.schema_hash import schema_hash
from singerlake.storage import S3Storage
from support.lakes import TAP, joined, record_msg, s3_lake_at, schema_msg, state_msg
from target_singerlake.target import TargetSingerlake

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
STREAM = "users"
PATHS = StreamPaths(TAP, STREAM)
LOCK = PATHS.lock(schema_hash(SCHEMA, ["id"]))


@pytest.fixture
def root(counted_s3_root, tmp_path, monkeypatch):
    """A fresh bucket behind the proxy, on a machine that has proven no root writable yet (SPEC.md §10)."""
    monkeypatch.setenv("SINGERLAKE_CACHE_DIR", str(tmp_path / "cache"))
    return counted_s3_root


def batches(first_id: int, sizes: list[int], activate: bool = False) -> list[bytes]:
    """The SCHEMA, then per batch its records and a STATE (the batch is cut at the STATE: batch_max_rows)."""
    lines = [schema_msg(STREAM, SCHEMA, ["id"])]
    if activate:
        lines.append(json.dumps({"type": "ACTIVATE_VERSION", "stream": STREAM, "version": 1700000000000}).encode())
    n = first_id
    for index, size in enumerate(sizes):
        for _ in range(size):
            lines.append(record_msg(STREAM, {"id": n, "name": f"name {n}"}, "2026-11-27T10:00:00.000Z"))
            n += 1
        lines.append(state_msg({"batch": index + 1, "last": n - 1}))
    return lines


def run(root, lines: list[bytes], rows: int) -> tuple[list, list[int], list[str]]:
    """One run of the target, counted from its construction; returns (its requests, the request count when
    each STATE went out, the STATEs)."""
    counter = root.counter
    start = counter.mark()
    target = TargetSingerlake(config={**s3_lake_at(root).config, "batch_max_rows": rows, "lock_lease_seconds": 600})
    marks: list[int] = []
    emit = target.lander.drain.emit_state

    def mark_and_emit(state: bytes) -> None:
        marks.append(len(counter.since(start).requests))
        emit(state)

    target.lander.drain.emit_state = mark_and_emit
    out = io.StringIO()
    with redirect_stdout(out):
        target.listen(file_input=io.BytesIO(joined(lines)))
    return counter.since(start).requests, marks, [line for line in out.getvalue().splitlines() if line]


def kinds(requests) -> Counter:
    return Counter(request.kind for request in requests)


def named(requests) -> Counter:
    """(kind, what) of each request: the lake's key with the root's prefix cut, data files as "data", the
    tap's change markers (SPEC.md §16) as "marker"."""
    found = Counter()
    for request in requests:
        key = request.key.split("some/prefix/", 1)[-1]
        found[request.kind, "data" if key.endswith(".singer.gz") else "marker" if key.startswith(f"changes/{TAP}/") else key] += 1
    return found


def direct(root) -> Lake:
    """The lake read from the server itself: not counted."""
    url, options = root
    return Lake(S3Storage(url, **{**options, "endpoint_url": root.counter.upstream}))


def refused(requests) -> list:
    """Requests answered with an error other than the 404 of a manifest or metadata file looked for."""
    return [r for r in requests if r.status is None or r.status >= 300 and not (r.status == 404 and r.kind in ("GET", "HEAD"))]


def test_a_cold_run_a_warm_run_and_further_batches_keep_the_budget(root):
    cold, marks, states = run(root, batches(1, [3]), rows=3)
    assert states == ['{"batch": 1, "last": 3}']
    assert named(cold) == {
        ("HEAD", ""): 1,  # the probe of a root no run on this machine wrote to: HeadBucket
        ("GET", PATHS.manifest): 1,  # the run's first open: no manifest (404) ...
        ("LIST", f"raw/{TAP}/"): 2,  # ... so it lists the tap's streams; the catalogue's rebuild lists them too
        ("PUT", LOCK): 1,
        ("PUT", PATHS.manifest): 2,  # created (create-only, the writer registered), then the commit
        ("PUT", "data"): 1,
        ("GET", catalogue_key(TAP)): 1,  # a new entry: read (404), rebuilt from the listing, written
        ("PUT", catalogue_key(TAP)): 1,
        ("GET", "raw/singerlake.json"): 1,  # a new tap: read (404), rebuilt from a listing of raw/, written
        ("LIST", "raw/"): 1,
        ("PUT", "raw/singerlake.json"): 1,
        ("PUT", "marker"): 2,  # cut by size: the run's open marker before the STATE, then its closing one
        ("DELETE", LOCK): 1,
    }, named(cold)
    assert kinds(cold) == {"HEAD": 1, "PUT": 8, "DELETE": 1, "GET": 3, "LIST": 3}

    warm, marks, states = run(root, batches(4, [3]), rows=100)  # the input ends before the batch is full: one commit
    assert states == ['{"batch": 1, "last": 6}']
    assert named(warm) == {
        ("GET", PATHS.manifest): 1,  # where the commit starts from
        ("PUT", "data"): 1,  # from an executor
        ("HEAD", LOCK): 1,  # the run's only commit goes without the lock while none exists (404)
        ("PUT", PATHS.manifest): 1,  # the commit, If-Match the ETag read
        ("PUT", "marker"): 1,  # the run's only batch: its closing marker names the stream before the STATE
    }, named(warm)
    assert kinds(warm) == {"PUT": 3, "GET": 1, "HEAD": 1}, "the warm stream's budget: <= 3 PUT, <= 1 GET, 0 LIST"
    assert [r.status for r in warm if r.kind == "HEAD" and r.key.endswith(LOCK)] == [404]
    assert refused(warm) == []

    cut, marks, states = run(root, batches(4, [3]), rows=3)  # cut by its size, not knowing that nothing follows
    assert named(cut) == {
        ("GET", PATHS.manifest): 1,
        ("PUT", LOCK): 1,
        ("PUT", "data"): 1,
        ("PUT", PATHS.manifest): 1,
        ("PUT", "marker"): 2,  # open, closed
        ("DELETE", LOCK): 1,
    }

    several, marks, states = run(root, batches(7, [3, 3, 3]), rows=3)  # the first batch takes the lock
    assert len(states) == 3 and len(marks) == 3
    for n, (begin, end) in enumerate([(marks[0], marks[1]), (marks[1], marks[2])], start=2):
        further = several[begin:end]
        assert named(further) == {("PUT", "data"): 1, ("PUT", PATHS.manifest): 1}, f"batch {n}: {named(further)}"
    first = {("GET", PATHS.manifest): 1, ("PUT", LOCK): 1, ("PUT", "data"): 1, ("PUT", PATHS.manifest): 1, ("PUT", "marker"): 1}
    assert named(several[: marks[0]]) == first, "the run's open marker, before its first STATE"
    end = named(several[marks[2] :])
    assert end == {("PUT", "marker"): 1, ("DELETE", LOCK): 1}, "the end of the run: its closing marker, the lock's release"

    lake = direct(root)
    manifest = lake.manifest(TAP, STREAM)
    assert manifest.commits == 6 and sum(entry["records"] for entry in manifest.files) == 18
    assert [entry["tap_stream_id"] for entry in lake.catalogue(TAP)["streams"]] == [STREAM]
    assert lake.taps() == [TAP]
    assert [info.key for info in lake.storage.list("raw/") if info.key.endswith(".lock")] == []


def test_a_warm_full_table_sync_adds_one_conditional_write_per_activate_version(root):
    """ACTIVATE_VERSION before the records (as SDK taps send it for a full-table sync): its commit starts
    from the manifest the writer read, one conditional write; the records' commit from the one it wrote."""
    assert run(root, batches(1, [2]), rows=2)[2]
    warm, _, states = run(root, batches(3, [2], activate=True), rows=2)
    assert states == ['{"batch": 1, "last": 4}']
    assert named(warm) == {
        ("GET", PATHS.manifest): 1,
        ("PUT", LOCK): 1,
        ("PUT", "data"): 1,
        ("PUT", PATHS.manifest): 2,  # the activation, then the records
        ("PUT", "marker"): 2,  # cut by size: the run's open marker, then its closing one
        ("DELETE", LOCK): 1,
    }, named(warm)
    manifest = direct(root).manifest(TAP, STREAM)
    assert [a["after_commit"] for a in manifest.activate_versions] == [1]
