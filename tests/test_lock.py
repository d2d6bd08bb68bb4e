"""Stream-schema locks over the real backends: a temp dir and S3 over HTTP (moto, SeaweedFS) (SPEC.md §8).

Racing writers are separate OS processes (``python -c`` children that load this file), so the
lock is exercised exactly as independent tap runs would use it: nothing shared but the storage.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from singerlake.commits.commit import register_writer
from singerlake.commits.errors import CommitRejected, LockLost, LockTimeout
from singerlake.commits.lock import Lock, read_lock, writer_id_key
from singerlake.format.layout import StreamPaths
from singerlake.lake import Lake
from singerlake.landing.writer import SchemaWriter
from singerlake.times import iso_ms, new_file_id, now_ms
from support.children import open_spec, run_together, spawn
from support.storage import Counting

TAP = "tap-locktest"
SCHEMA_MESSAGE = {
    "type": "SCHEMA",
    "stream": "orders",
    "schema": {"type": "object", "properties": {"id": {"type": "integer"}}},
    "key_properties": ["id"],
}
LOCK_KEY = StreamPaths(TAP, "orders").lock("0123456789abc")  # where a stream-schema's lock lives


# -- 1. many processes, one holder -----------------------------------------------------------------


def _race_child(spec: dict, key: str, rounds: int, hold_s: float, out: str) -> None:
    storage = open_spec(spec)
    # a lease far longer than a holding (0.1 s): a holder starved of CPU by tests running beside this one
    # must not lose the lock mid-hold (taking over an expired lease is test 2's subject, not this one's)
    lock = Lock(storage, key, lease_s=10, drift_s=1, wait_s=60, poll_s=0.05)
    storage.exists(key)  # connect before the start signal, so all children start on an equal footing
    print("ready", flush=True)
    sys.stdin.readline()
    held = []
    for _ in range(rounds):
        lock.acquire()
        start = time.monotonic()
        seen = set()
        while time.monotonic() < start + hold_s:
            info = read_lock(storage, key)
            seen.add(info.writer_id if info else None)
            time.sleep(0.01)
        lock.refresh()  # a conditional write on our own version: fails if anyone replaced it meanwhile
        end = time.monotonic()
        held.append({"writer_id": lock.writer_id, "start": start, "end": end, "seen": sorted(map(str, seen))})
        held[-1]["released"] = lock.release()
    Path(out).write_text(json.dumps(held))


def test_processes_racing_for_one_lock_hold_it_one_at_a_time(lake_spec, tmp_path):
    key = LOCK_KEY
    processes, rounds = 8, 2
    outs = [tmp_path / f"held-{n}.json" for n in range(processes)]
    children = [spawn(__file__, "_race_child", lake_spec, key, rounds, 0.1, str(out)) for out in outs]
    run_together(children, timeout=120)

    held = [interval for out in outs for interval in json.loads(out.read_text())]
    assert len(held) == processes * rounds
    assert len({h["writer_id"] for h in held}) == processes * rounds  # a fresh writer id per acquisition
    for h in held:
        assert h["seen"] == [h["writer_id"]], f"while {h['writer_id']} held the lock, storage named {h['seen']}"
        assert h["released"] is True
    held.sort(key=lambda h: h["start"])
    for before, after in zip(held, held[1:], strict=False):
        assert before["end"] <= after["start"], f"{before['writer_id']} and {after['writer_id']} held the lock at once"
    # At any instant during the race at most one process was inside its holding interval.
    instants = sorted({h["start"] for h in held} | {h["end"] for h in held})
    for t in instants:
        assert sum(h["start"] <= t < h["end"] for h in held) <= 1
    assert read_lock(open_spec(lake_spec), key) is None  # the last holder released it


# -- 2. a killed holder is taken over only after lease + drift -----------------------------------------


# Long enough that the impatient waiter below gives up well inside it on a loaded machine
HOLDER_LEASE_S, HOLDER_DRIFT_S = 5.0, 1.0


def _hold_child(spec: dict, key: str) -> None:
    lock = Lock(open_spec(spec), key, lease_s=HOLDER_LEASE_S, drift_s=HOLDER_DRIFT_S, heartbeat=True).acquire()
    print(f"held {lock.writer_id}", flush=True)
    time.sleep(300)


def test_killed_holder_is_taken_over_only_after_lease_plus_drift(lake_spec):
    storage = open_spec(lake_spec)
    key = LOCK_KEY
    lease_s, drift_s = HOLDER_LEASE_S, HOLDER_DRIFT_S
    holder = spawn(__file__, "_hold_child", lake_spec, key)
    try:
        line = holder.stdout.readline().split()
        assert line[:1] == ["held"], holder.stderr.read()
        holder_id = line[1]
        # Let the heartbeat refresh at least once, so the lease is counted from a refresh.
        deadline = time.monotonic() + 10
        while True:
            info = read_lock(storage, key)
            assert info is not None and info.writer_id == holder_id
            if info.refreshed_ms > info.acquired_ms:
                break
            assert time.monotonic() < deadline, "the holder's heartbeat never refreshed the lock"
            time.sleep(0.05)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert holder.returncode == -signal.SIGKILL
    time.sleep(0.2)  # let any refresh that was in flight at the kill land before we read the last one
    last = read_lock(storage, key)
    assert last is not None and last.writer_id == holder_id and last.lease_s == lease_s

    # A waiter that gives up before lease + drift has passed gets LockTimeout and leaves the lock alone.
    # Its own lease is tiny: the holder's recorded lease is what counts.
    impatient = Lock(storage, key, lease_s=0.1, drift_s=drift_s, wait_s=1.0, poll_s=0.05)
    with pytest.raises(LockTimeout, match=holder_id):
        impatient.acquire()
    assert now_ms() - last.refreshed_ms < (lease_s + drift_s) * 1000
    assert impatient.writer_id is None
    assert read_lock(storage, key).writer_id == holder_id

    taker = Lock(storage, key, lease_s=lease_s, drift_s=drift_s, wait_s=30, poll_s=0.05)
    taker.acquire()
    taken_ms = now_ms()
    try:
        assert taken_ms - last.refreshed_ms >= (lease_s + drift_s) * 1000
        assert read_lock(storage, key).writer_id == taker.writer_id != holder_id
    finally:
        assert taker.release() is True


# -- 3. a stale holder's commit is rejected ---------------------------------------------------------


def _lines(*ids: int) -> tuple[list[bytes], list[int]]:
    stamp = now_ms()
    return [json.dumps({"type": "RECORD", "stream": "orders", "record": {"id": i}}).encode() for i in ids], [stamp] * len(ids)


def test_stale_holders_commit_is_rejected_and_its_files_stay_invisible(lake_spec):
    lake = Lake(open_spec(lake_spec))
    a = SchemaWriter(lake, TAP, SCHEMA_MESSAGE, lease_s=1, drift_s=0.5, wait_s=5)
    a.lock.heartbeat = False  # A stalls: it never refreshes, so its lease runs out
    a.open()
    file_a = a.write_file(*_lines(1, 2))

    b = SchemaWriter(lake, TAP, SCHEMA_MESSAGE, lease_s=1, drift_s=0.5, wait_s=30)
    b.lock.poll_s = 0.05
    b.open()  # takes the lock over once A's lease + drift has passed (it registers in its first commit)
    try:
        assert b.lock.writer_id != a.lock.writer_id
        file_b = b.write_file(*_lines(3))
        b.commit([file_b])

        with pytest.raises(CommitRejected):
            a.commit([file_a])
        with pytest.raises(LockLost):
            a.lock.refresh()

        manifest = lake.manifest(TAP, "orders")
        assert [entry["id"] for entry in manifest.files] == [file_b["id"]]
        assert manifest.commits == 1
        assert manifest.writers[b.schema_hash]["writer_id"] == b.lock.writer_id
        assert lake.storage.exists(file_a["path"])  # A's file is on storage, just never committed
        assert file_a["id"] not in manifest.file_ids()
    finally:
        b.close()
    a.close()
    # Nothing A does after losing the lock may change what readers see.
    assert [entry["id"] for entry in lake.manifest(TAP, "orders").files] == [file_b["id"]]


# -- 3b. a writer registers in its first commit (SPEC.md §9) ----------------------------------------


def _landed_before(lake: Lake) -> str:
    """A stream that has data: a writer that committed and released; returns its writer id."""
    with SchemaWriter(lake, TAP, SCHEMA_MESSAGE) as w0:
        w0.commit([w0.write_file(*_lines(0))])
        return w0.lock.writer_id


def _stalled(lake: Lake, after: str | None = None) -> SchemaWriter:
    """A writer that opens and then stalls: it never refreshes its lock, so its lease runs out."""
    a = SchemaWriter(lake, TAP, SCHEMA_MESSAGE, lease_s=1, drift_s=0.5, wait_s=5)
    a.lock.heartbeat = False
    a.look()
    a.lock.acquire(after=after)
    return a


def _taker(lake: Lake) -> SchemaWriter:
    b = SchemaWriter(lake, TAP, SCHEMA_MESSAGE, lease_s=1, drift_s=0.5, wait_s=30)
    b.lock.poll_s = 0.05
    return b


def _ids(lake: Lake) -> list[str]:
    return [entry["id"] for entry in lake.manifest(TAP, "orders").files]


def _registered(lake: Lake) -> str:
    (entry,) = lake.manifest(TAP, "orders").writers.values()
    return entry["writer_id"]


def test_a_commit_of_the_overtaken_writer_before_the_takers_registration_comes_before_all_of_the_takers_data(lake_spec):
    lake = Lake(open_spec(lake_spec))
    w0 = _landed_before(lake)
    a = _stalled(lake)
    assert _registered(lake) == w0, "opening a stream with a manifest registers nobody"
    file_a = a.write_file(*_lines(1, 2))
    b = _taker(lake)
    acquire = b.lock.acquire

    def a_commits_as_b_takes_over(**options):
        acquire(**options)
        a.commit([file_a])  # A, unaware, commits after B took the lock, before B registers: accepted

    b.lock.acquire = a_commits_as_b_takes_over
    b.open()
    try:
        assert b.took_over and _registered(lake) == b.lock.writer_id, "a taker registers as it takes over"
        assert writer_id_key(b.lock.writer_id) > writer_id_key(a.lock.writer_id)
        with pytest.raises(CommitRejected, match=f"lost its lock to {b.lock.writer_id}"):
            a.commit([a.write_file(*_lines(3))])
        file_b = b.write_file(*_lines(4))
        b.commit([file_b])
        assert _ids(lake)[1:] == [file_a["id"], file_b["id"]], "A's records order before all of B's"
        assert [entry["commit"] for entry in lake.manifest(TAP, "orders").files] == [1, 2, 3]
    finally:
        b.close()
        a.close()


def test_a_writer_that_knows_it_lost_its_lock_commits_nothing(lake_spec):
    lake = Lake(open_spec(lake_spec))
    _landed_before(lake)
    a = _stalled(lake)
    file_a = a.write_file(*_lines(1))
    b = _taker(lake).open()
    try:
        with pytest.raises(LockLost):
            a.lock.refresh()  # what A's heartbeat would have found
        with pytest.raises(LockLost):
            a.commit([file_a])
        assert file_a["id"] not in _ids(lake)
    finally:
        b.close()
        a.close()


def test_the_overtaken_writer_is_refused_even_when_its_clock_ran_ahead(lake_spec):
    """A's id is an hour ahead of every other clock: B, taking its lock over, draws an id above A's (it
    read A's id in the lock) and registers; A's commit is then refused, nothing of it visible."""
    lake = Lake(open_spec(lake_spec))
    _landed_before(lake)
    a = _stalled(lake, after=f"writer-{new_file_id(now_ms() + 3_600_000)}")
    file_a = a.write_file(*_lines(1))
    b = _taker(lake).open()
    try:
        assert writer_id_key(b.lock.writer_id) > writer_id_key(a.lock.writer_id)
        with pytest.raises(CommitRejected, match=f"lost its lock to {b.lock.writer_id}"):
            a.commit([file_a])
        assert file_a["id"] not in _ids(lake)
    finally:
        b.close()
        a.close()


def test_writers_of_one_stream_schema_in_turn_each_register_in_their_first_commit(lake_spec):
    lake = Lake(open_spec(lake_spec))
    holders, files = [], []
    for n in range(3):
        with SchemaWriter(lake, TAP, SCHEMA_MESSAGE) as writer:
            files.append(writer.write_file(*_lines(n)))
            writer.commit([files[-1]])
            holders.append(writer.lock.writer_id)
            assert _registered(lake) == writer.lock.writer_id
    assert holders == sorted(holders, key=writer_id_key)
    assert _ids(lake) == [f["id"] for f in files]


def test_a_successor_whose_id_came_out_smaller_proves_it_holds_the_lock_and_commits(lake_spec):
    """P registered an id greater than that of N, which acquired after P released (P's clock ahead, or N's
    create slow to arrive): N's first commit finds it, rewrites its lock under an id above P's (proof
    that it still holds it: one write more) and commits; P could not commit any more."""
    lake = Lake(open_spec(lake_spec))
    _landed_before(lake)
    n = SchemaWriter(lake, TAP, SCHEMA_MESSAGE)
    n.look()  # before P registers: N's id will not be drawn above P's
    p = SchemaWriter(lake, TAP, SCHEMA_MESSAGE)
    p.look()
    p.lock.acquire(after=f"writer-{new_file_id(now_ms() + 3_600_000)}")
    p.commit([p.write_file(*_lines(1))])
    p.close()
    n.take()
    try:
        assert writer_id_key(n.lock.writer_id) < writer_id_key(p.lock.writer_id)
        counting = Counting(lake.storage)
        n.lake.storage = n.lock.storage = counting
        file_n = n.write_file(*_lines(2))
        n.commit([file_n])
        assert writer_id_key(n.lock.writer_id) > writer_id_key(p.lock.writer_id)
        assert read_lock(lake.storage, n.lock.key).writer_id == n.lock.writer_id == _registered(lake)
        writes = [key for method, key in counting.requests if method == "write"]
        assert writes.count(n.lock.key) == 1, "the proof: one conditional write of the lock"
        assert _ids(lake)[-1] == file_n["id"]
    finally:
        n.close()


def _turns_child(spec: dict, rounds: int, out: str) -> None:
    lake = Lake(open_spec(spec))
    print("ready", flush=True)
    sys.stdin.readline()
    done = []
    for n in range(rounds):
        with SchemaWriter(lake, TAP, SCHEMA_MESSAGE, lease_s=30, drift_s=5, wait_s=120) as writer:
            writer.lock.poll_s = 0.02
            record = writer.write_file(*_lines(n))
            writer.commit([record])
            done.append({"id": record["id"], "writer_id": writer.lock.writer_id})
    Path(out).write_text(json.dumps(done))


def test_two_processes_taking_turns_on_one_stream_schema_commit_every_file(lake_spec, tmp_path):
    """Each acquisition reads the manifest, takes the lock after the other released it and registers in
    its first commit: no commit is refused, whichever process held the lock last."""
    outs = [tmp_path / f"turns-{n}.json" for n in range(2)]
    run_together([spawn(__file__, "_turns_child", lake_spec, 4, str(out)) for out in outs], timeout=300)
    done = [entry for out in outs for entry in json.loads(out.read_text())]
    manifest = Lake(open_spec(lake_spec)).manifest(TAP, "orders")
    assert sorted(entry["id"] for entry in manifest.files) == sorted(entry["id"] for entry in done)
    assert manifest.commits == len(done) == 8
    last = max((entry["writer_id"] for entry in done), key=writer_id_key)
    assert manifest.writers[next(iter(manifest.versions))]["writer_id"] == last


def test_a_registration_of_an_older_version_gives_way_only_to_a_writer_that_proves_it_holds_the_lock(lake_spec):
    """Writers before 2.2's fence drew random ids (and registered as they took the lock): such an id
    orders before nothing, so a writer finding one proves it holds the lock, then registers over it;
    had that older writer taken the lock over, the proof fails and the commit is refused."""
    lake = Lake(open_spec(lake_spec))
    _landed_before(lake)
    paths, old_id = StreamPaths(TAP, "orders"), "writer-" + "f" * 32
    with SchemaWriter(lake, TAP, SCHEMA_MESSAGE) as later:
        register_writer(lake.storage, paths, later.schema_hash, old_id)  # registered, then released, before `later` took the lock
        later.commit([later.write_file(*_lines(6))])
        assert _registered(lake) == later.lock.writer_id
    earlier = SchemaWriter(lake, TAP, SCHEMA_MESSAGE).open()
    try:
        # an older writer takes the lock over (its own lock body) and registers
        lake.storage.write(
            earlier.lock.key, json.dumps({"writer-id": old_id, "acquired": iso_ms(now_ms()), "refreshed": iso_ms(now_ms())}).encode()
        )
        register_writer(lake.storage, paths, earlier.schema_hash, old_id)
        with pytest.raises(CommitRejected, match=f"lost its lock to {old_id}"):
            earlier.commit([earlier.write_file(*_lines(7))])
    finally:
        earlier.close()


def test_a_retried_commit_whose_files_are_in_changes_nothing_even_after_a_later_writer_registered(lake_spec):
    lake = Lake(open_spec(lake_spec))
    with SchemaWriter(lake, TAP, SCHEMA_MESSAGE) as a:
        record = a.write_file(*_lines(1))
        a.commit([record])
        register_writer(lake.storage, a.paths, a.schema_hash, f"writer-{new_file_id(now_ms() + 1000)}")
        stored = lake.storage.read(a.paths.manifest)
        a.commit([record])  # e.g. its response was lost: the manifest holds it, so it is done
        assert lake.storage.read(a.paths.manifest) == stored, "nothing written"
        assert _ids(lake) == [record["id"]]


def test_a_first_commit_refused_by_vacuums_horizon_registers_nothing(lake_spec):
    """A stalled writer's files are vacuumed (its lock went stale); its first commit, the one that would
    register it, is refused for the horizon (SPEC.md §15) and leaves the registration as it was; the
    writer that takes the lock over then commits and registers."""
    from singerlake.jobs.vacuum import vacuum_stream

    lake = Lake(open_spec(lake_spec))
    w0 = _landed_before(lake)
    a = SchemaWriter(lake, TAP, SCHEMA_MESSAGE, lease_s=60, drift_s=10, wait_s=5)
    a.lock.heartbeat = False
    a.open()
    try:
        file_a = a.write_file(*_lines(1))
        # A stalled for an hour: its lock reads stale, so vacuum no longer leaves its files.
        then = iso_ms(now_ms() - 3_600_000)
        body = {"writer-id": a.lock.writer_id, "acquired": then, "refreshed": then, "lease_seconds": 1}
        lake.storage.write(a.lock.key, json.dumps(body).encode())
        deleted = vacuum_stream(lake, a.paths, retention_s=0, apply=True, now=now_ms())
        assert [d.path for d in deleted] == [file_a["path"]]
        with pytest.raises(CommitRejected, match="vacuum"):
            a.commit([file_a])
        manifest = lake.manifest(TAP, "orders")
        assert manifest.writers[a.schema_hash]["writer_id"] == w0 and manifest.vacuumed == file_a["id"]
        with SchemaWriter(lake, TAP, SCHEMA_MESSAGE, wait_s=30) as b:
            assert b.took_over
            b.commit([b.write_file(*_lines(2))])
            assert lake.manifest(TAP, "orders").writers[b.schema_hash]["writer_id"] == b.lock.writer_id
    finally:
        a.close()


# -- 4. releasing after a takeover leaves the new owner alone ------------------------------------------


def _taken_over(storage, key: str) -> tuple[Lock, Lock]:
    """A holds the lock without refreshing it; B waits out A's lease and takes it over."""
    a = Lock(storage, key, lease_s=1, drift_s=0.5, heartbeat=False).acquire()
    b = Lock(storage, key, lease_s=1, drift_s=0.5, wait_s=30, poll_s=0.05).acquire()
    return a, b


def test_release_after_takeover_does_not_clobber_the_new_owner(lake_spec):
    storage = open_spec(lake_spec)
    key = LOCK_KEY
    a, b = _taken_over(storage, key)
    try:
        assert b.writer_id != a.writer_id
        assert b.took_over and not a.took_over  # the taker knows its predecessor did not finish (SPEC.md §9)
        assert writer_id_key(b.writer_id) > writer_id_key(a.writer_id)
        assert a.release() is False
        assert a.lost
        info = read_lock(storage, key)
        assert info is not None and info.writer_id == b.writer_id
        b.refresh()  # B's version of the lock is untouched
        assert read_lock(storage, key).writer_id == b.writer_id
    finally:
        assert b.release() is True
    assert read_lock(storage, key) is None


def test_holder_that_was_taken_over_learns_it_on_refresh(lake_spec):
    storage = open_spec(lake_spec)
    key = LOCK_KEY
    a, b = _taken_over(storage, key)
    try:
        with pytest.raises(LockLost):
            a.refresh()
        with pytest.raises(LockLost):
            a.check()
        assert a.release() is False
        assert read_lock(storage, key).writer_id == b.writer_id
    finally:
        assert b.release() is True


# -- 5. writer ids are never reused -----------------------------------------------------------------


def test_writer_id_is_never_reused(lake_spec):
    storage = open_spec(lake_spec)
    key = LOCK_KEY
    lock = Lock(storage, key, lease_s=5, drift_s=1, wait_s=5, poll_s=0.05)
    ids = []
    for _ in range(3):
        lock.acquire()
        ids.append(lock.writer_id)
        assert read_lock(storage, key).writer_id == lock.writer_id
        with pytest.raises(RuntimeError):
            lock.acquire()  # one object holds at most one acquisition
        assert lock.release() is True
        assert read_lock(storage, key) is None
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids, key=writer_id_key), "a later acquisition has a greater id (UUIDv7, SPEC.md §8)"
    # A registered writer whose clock ran an hour ahead: an acquirer that read its id still draws a greater one.
    ahead = f"writer-{new_file_id(now_ms() + 3_600_000)}"
    lock.acquire(after=ahead)
    try:
        assert writer_id_key(lock.writer_id) > writer_id_key(ahead)
        assert read_lock(storage, key).writer_id == lock.writer_id
    finally:
        lock.release()


# -- 6. many held locks share one heartbeat -----------------------------------------------------------


def test_many_held_locks_are_all_refreshed_by_a_few_threads(tmp_path):
    """A writer holds a lock per stream-schema, hundreds at once: one heartbeat schedule refreshes
    each every lease/3 on a few threads, instead of a thread per lock."""
    from singerlake.storage import LocalStorage

    storage = LocalStorage(tmp_path / "lake")
    before = threading.active_count()
    locks = [Lock(storage, StreamPaths(TAP, f"s{n}").lock("0123456789abc"), lease_s=0.6, drift_s=5).acquire() for n in range(200)]
    try:
        assert threading.active_count() - before <= 10
        first = {lock.key: read_lock(storage, lock.key).refreshed_ms for lock in locks}
        deadline = time.monotonic() + 60
        while True:
            refreshed = {lock.key: read_lock(storage, lock.key).refreshed_ms for lock in locks}
            if all(refreshed[key] > first[key] for key in first):
                break
            assert time.monotonic() < deadline, "some locks were never refreshed"
            time.sleep(0.1)
        assert threading.active_count() - before <= 10
    finally:
        assert all(lock.release() for lock in locks)
    assert [info.key for info in storage.list("raw/")] == []
