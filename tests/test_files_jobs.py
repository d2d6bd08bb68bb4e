"""ls, verify, repair and vacuum know pushed files (SPEC.md §14): the index is checked against the
bytes and records, rebuilt where the committed segments say, and leftovers of dead pushes go."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from singerlake.files import index, layout
from singerlake.lake import Lake
from support.cli_session import CliSession
from support.lakes import LakeUnderTest
from support.writers import LONG_AGO_MS, Held, make_stale


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "singerlake.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def pushed(tmp_path):
    """A lake of pushed files alone (no raw/): three logs, one spanning midnight."""
    src = tmp_path / "logs"
    src.mkdir()
    for n in range(3):
        (src / f"app-{n}.log").write_bytes(os.urandom(2000 + n))
    root = str(tmp_path / "lake")
    lake = Lake.open(root)
    lake.push(src, what="app-log", where="web02", work_id="deploy-7", start="2024-03-02T23:00:00Z", end="2024-03-03T01:00:00Z")
    return root, lake


def test_ls_and_verify_with_hashes_over_a_lake_of_pushed_files(pushed):
    root, lake = pushed
    listed = _run("ls", root, "--json")
    assert listed.returncode == 0, listed.stderr
    info = json.loads(listed.stdout)["files"]["app-log"]
    assert (info["files"], info["wheres"], info["first_day"], info["last_day"]) == (3, ["web02"], "2024-03-02", "2024-03-03")

    with CliSession() as cli:  # both verify runs (hashes, on Spark) on one Spark session
        clean = cli.run("verify", root)
        assert clean.returncode == 0 and "clean" in clean.stdout, clean.stdout + clean.stderr
        victim = lake.find_files("app-log", start="2024-03-03")[0]
        path = os.path.join(root, *victim["key"].split("/"))
        data = bytearray(open(path, "rb").read())
        data[10] ^= 0xFF
        with open(path, "wb") as handle:
            handle.write(bytes(data))
        dirty = cli.run("verify", root)
        assert dirty.returncode == 1 and f"hash_mismatch: {victim['key']}" in dirty.stdout, dirty.stdout


def test_repair_restores_lost_pointers_and_record_files_from_the_committed_segments(pushed):
    root, lake = pushed
    record = lake.find_files("app-log", start="2024-03-03")[0]
    txn_pointer = f"{layout.day_dir('app-log', '2024-03-03')}{record['txn']}"
    lake.storage.delete(txn_pointer)
    lake.storage.delete(layout.record_key(record["id"]))
    assert lake.find_files("app-log", start="2024-03-03T00:30:00Z", end="2024-03-03T00:40:00Z") == []
    found = _run("verify", root, "--no-hashes")
    assert found.returncode == 1 and txn_pointer in found.stdout and layout.record_key(record["id"]) in found.stdout

    repaired = _run("repair", root, "--apply")
    assert repaired.returncode == 0, repaired.stderr
    assert _run("verify", root, "--no-hashes").returncode == 0
    assert len(lake.find_files("app-log", start="2024-03-03T00:30:00Z", end="2024-03-03T00:40:00Z")) == 3
    assert lake.file_record(record["id"])["hash"] == record["hash"]


def test_vacuum_deletes_what_a_dead_push_left_and_nothing_committed(pushed, tmp_path):
    root, lake = pushed
    extra = tmp_path / "late.log"
    extra.write_bytes(b"never committed")
    # A real push, stopped where its commit has written the pointers and not the segment (the commit point), then killed.
    argv = [sys.executable, "-m", "singerlake.cli", "push", root, str(extra), "--what", "app-log", "--where", "web02"]
    argv += ["--work-id", "deploy-7", "--start", "2024-03-03T00:10:00Z"]
    dead = Held(argv, "push-before-commit", {key: value for key, value in os.environ.items() if key != "SINGERLAKE_PAUSE_AT"})
    dead.wait_paused().kill()
    pointers = [info.key for info in lake.storage.list("files/index/app-log/") if info.key.split("/")[3] in ("day", "work", "long")]
    txns = {key.rsplit("/", 1)[1] for key in pointers} - {record["txn"] for record in lake.find_files("app-log", work_id="deploy-7")}
    assert len(txns) == 1, pointers
    (txn,) = txns
    dead_pointers = [f"{layout.day_dir('app-log', '2024-03-03')}{txn}", f"{layout.work_dir('app-log', 'deploy-7')}{txn}"]
    assert sorted(key for key in pointers if key.endswith(txn)) == dead_pointers, "the kill landed after the commit wrote its pointers"
    assert not lake.storage.exists(layout.segment_key("app-log", txn)), "and before its segment, the commit point"
    leases = [info.key for info in lake.storage.list("files/index/app-log/pending/")]
    assert len(leases) == 1, leases
    make_stale(LakeUnderTest("local", {"lake_root": root}, lake.storage), leases[0], LONG_AGO_MS)  # long after the push died
    assert len(lake.find_files("app-log", work_id="deploy-7")) == 3  # the dead push is invisible
    before = {info.key for info in lake.storage.list("files/")}

    dry = _run("vacuum", root, "--retention", "0s", "--force", "--json")
    planned = {d["path"] for d in json.loads(dry.stdout)["deletions"]}
    kinds = sorted(key.split("/")[1] for key in planned)
    assert kinds == ["data", "ids", "index", "index", "index"], planned  # its bytes, its record, and in the index:
    assert {key for key in planned if key.startswith("files/index/")} == {*dead_pointers, *leases}  # its pointers and lease
    assert {info.key for info in lake.storage.list("files/")} == before  # a dry run deletes nothing

    applied = _run("vacuum", root, "--retention", "0s", "--force", "--apply")
    assert applied.returncode == 0, applied.stderr
    aborted = layout.segment_key("app-log", txn)  # the dead push's txn aborted first: it can never commit (SPEC.md §15)
    assert {info.key for info in lake.storage.list("files/")} == (before - planned) | {aborted}
    assert index.read_segment(lake.storage, "app-log", txn) is None
    assert _run("verify", root).returncode == 0
    for record in lake.find_files("app-log", work_id="deploy-7"):
        assert lake.fetch(record["id"], str(tmp_path / "out" / record["id"]))
