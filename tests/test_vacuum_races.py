"""Vacuum racing live pushes (SPEC.md §15): what a push may still commit is never deleted.

Each test holds a real ``singerlake push`` at a named step (``SINGERLAKE_PAUSE_AT``), runs the real
``singerlake vacuum`` meanwhile, then lets the push go on. Either it fails loudly and acknowledges
nothing, or every file it acknowledges ("pushed") reads back exactly. Local lakes and SeaweedFS;
timeouts only detect hangs.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.writers import (
    LONG_AGO_MS,
    PUSH_ARGS,
    Held,
    check_pushed,
    check_readable,
    cli_env,
    files_to_push,
    make_stale,
    now_ms,
    pending_leases,
    push,
    run,
    singerlake,
    vacuum_now,
)


def test_a_push_held_before_its_commit_keeps_its_files_through_a_vacuum(cli_lake, tmp_path):
    lake = cli_lake
    files = files_to_push(tmp_path)
    held = push(lake, tmp_path, "push-before-commit")
    vacuumed = vacuum_now(lake)
    check_pushed(lake, tmp_path, held.release(), files)
    assert "push is under way" in vacuumed.stdout, vacuumed.stdout  # its lease was live: the what waited for a later pass
    assert pending_leases(lake) == [], "the push drops its lease once committed"


def test_a_push_whose_lease_went_stale_is_aborted_and_stores_its_files_again(cli_lake, tmp_path):
    lake = cli_lake
    files = files_to_push(tmp_path)
    held = push(lake, tmp_path, "push-before-commit")
    [lease] = pending_leases(lake)
    make_stale(lake, lease)  # the push stalled past its lease: vacuum may take what it stored
    vacuumed = vacuum_now(lake)
    deleted = [line for line in vacuumed.stdout.splitlines() if line.startswith("files/data/")]
    assert len(deleted) == 2, vacuumed.stdout  # both files' bytes went
    check_pushed(lake, tmp_path, held.release(), files)  # its commit failed, so it stored them again under a new txn


def test_bytes_stored_long_ago_and_found_by_a_live_push_are_kept(cli_lake, tmp_path):
    """A push killed before its commit left the file's bytes; much later the same file is pushed again,
    finds them stored (a create-only write that fails) and is held before its commit while vacuum runs
    with the default retention: the old bytes are the live push's now."""
    lake = cli_lake
    files = files_to_push(tmp_path)
    push(lake, tmp_path, "push-before-commit").kill()
    for dead_lease in pending_leases(lake):
        make_stale(lake, dead_lease, LONG_AGO_MS)
    retention = []
    if lake.kind == "local":  # ten days on: everything the dead push wrote is older than the default 7 days
        then = (now_ms() - LONG_AGO_MS) / 1000
        for path in Path(lake.config["lake_root"], "files").rglob("*"):
            os.utime(path, (then, then))
    else:  # an S3 server keeps its own times: a short retention makes the same bytes old enough
        time.sleep(2)
        retention = ["--retention", "1s", "--force"]
    again = push(lake, tmp_path, "push-before-commit")
    vacuumed = run(lake, "vacuum", "--apply", *retention)
    assert vacuumed.returncode == 0 and not [line for line in vacuumed.stdout.splitlines() if line.startswith("files/data/")], (
        vacuumed.stdout
    )
    check_pushed(lake, tmp_path, again.release(), files)
    vacuum_now(lake)  # the dead push's pointers, record and lease go; the bytes are committed now
    assert pending_leases(lake) == []
    check_readable(lake, tmp_path, files)


def test_a_push_into_a_new_what_killed_before_its_pointers_is_reported_and_removed(cli_lake, tmp_path):
    lake = cli_lake
    files_to_push(tmp_path)
    push(lake, tmp_path, "push-before-pointers").kill()
    stored = lake.keys("files/data/")
    assert len(stored) == 2, stored
    verify = run(lake, "verify", "--no-hashes")
    assert verify.returncode == 1 and all(f"orphan: {key}" in verify.stdout for key in stored), verify.stdout
    [lease] = pending_leases(lake)
    make_stale(lake, lease)  # the dead push's lease, once lease + drift have passed
    assert "stale_lock" in run(lake, "verify", "--no-hashes").stdout
    vacuum_now(lake)
    assert lake.keys("files/data/") == [] and lake.keys("files/ids/") == [] and pending_leases(lake) == []
    verify = run(lake, "verify", "--no-hashes")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_retention_under_an_hour_is_refused_unless_forced(cli_lake, tmp_path):
    lake = cli_lake
    files_to_push(tmp_path)
    assert run(lake, "push", str(tmp_path / "src"), *PUSH_ARGS).returncode == 0
    refused = run(lake, "vacuum", "--retention", "30m", "--apply")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "retention" in refused.stderr and "--force" in refused.stderr and "Traceback" not in refused.stderr
    assert run(lake, "vacuum", "--retention", "30m", "--apply", "--force").returncode == 0


VACUUM_LOOPS = 3  # vacuums side by side, each a CLI process after the other: some always between a push's looks


@pytest.mark.heavy
def test_pushes_racing_a_vacuum_loop_lose_nothing(cli_lake, tmp_path):
    lake = cli_lake
    pushers, per_pusher = 3, 1500 if lake.kind == "local" else 300
    sources = {}
    for n in range(pushers):
        src = tmp_path / f"src{n}"
        src.mkdir()
        for i in range(per_pusher):
            data = f"pusher {n} file {i}\n".encode() * (1 + i % 5)
            (src / f"f{n}-{i:05d}.txt").write_bytes(data)
            sources[f"f{n}-{i:05d}.txt"] = data
    env = cli_env(lake)
    outputs = [(tmp_path / f"push{n}.out", tmp_path / f"push{n}.err") for n in range(pushers)]
    pushes = []
    for n, (out, err) in enumerate(outputs):  # into files: a pipe nobody reads while the vacuums run would fill up
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            command = singerlake(lake, "push", str(tmp_path / f"src{n}"), *PUSH_ARGS)
            pushes.append(subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env))
    rounds = []

    def vacuum_loop() -> None:
        while any(p.poll() is None for p in pushes):
            if lake.keys("files/"):  # the first push made the lake
                vacuum_now(lake)
                rounds.append(1)

    loops = [threading.Thread(target=vacuum_loop) for _ in range(VACUUM_LOOPS)]
    for loop in loops:
        loop.start()
    for loop in loops:
        loop.join()
    outputs = [(out.read_bytes(), err.read_bytes()) for out, err in outputs]
    assert [p.returncode for p in pushes] == [0] * pushers, [err.decode()[-2000:] for _, err in outputs]
    print(f"vacuum rounds while pushing: {len(rounds)}")
    acknowledged = {r["id"]: Path(r["path"]).name for out, _ in outputs for r in json.loads(out)["pushed"]}
    assert sorted(acknowledged.values()) == sorted(sources), "each file pushed once"
    vacuum_now(lake)
    verify = run(lake, "verify", "--no-hashes")
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr
    out = tmp_path / "fetched"
    fetched = run(lake, "files", "--what", "app-log", "--start", "2026-11-20", "--end", "2026-11-21", "--fetch", str(out),
                  "--name", "{name}", "--json")  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    assert {path.name: path.read_bytes() for path in out.iterdir()} == sources


def test_a_vacuum_stalled_before_its_deletes_deletes_nothing_once_a_push_took_its_lock_over(cli_lake, tmp_path):
    """A dead push left a file's bytes; vacuum judges them leftovers and stalls before deleting; the same
    file is pushed again, finds the stalled vacuum's lock stale, takes it over and reuses the bytes. The
    vacuum, let go, finds its lock gone and deletes nothing."""
    lake = cli_lake
    files = files_to_push(tmp_path)
    push(lake, tmp_path, "push-before-commit").kill()
    for dead_lease in pending_leases(lake):
        make_stale(lake, dead_lease)
    command = singerlake(lake, "vacuum", "--retention", "0s", "--force", "--apply")
    stalled = Held(command, "vacuum-before-delete", cli_env(lake)).wait_paused()
    make_stale(lake, "files/index/app-log/vacuum.lock")  # how its lock reads once it stalled past its lease
    done = subprocess.run(singerlake(lake, "push", str(tmp_path / "src"), *PUSH_ARGS), capture_output=True, env=cli_env(lake))
    check_pushed(lake, tmp_path, done, files)
    vacuumed = stalled.release()
    assert vacuumed.returncode == 0 and b"taken over" in vacuumed.stdout, vacuumed.stdout
    check_readable(lake, tmp_path, files)
