"""Vacuum racing live landings, compactions and projections (SPEC.md §15), and a randomised soak of
every writer beside a vacuum loop: nothing a writer acknowledged (a STATE, "pushed", a table version)
is lost. Real CLI processes held at a named step (``SINGERLAKE_PAUSE_AT``); timeouts only detect hangs.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from pathlib import Path

import pytest
from singerlake.tables.heads import heads_key
from support.lakes import TAP, local_lake_at
from support.writers import (
    HANG_S,
    PUSH_ARGS,
    RECORDS,
    Held,
    cli_env,
    land,
    landing_input,
    make_stale,
    replayed,
    run,
    singerlake,
    states,
    target_command,
    vacuum_now,
)


def held_landing(lake, tmp_path: Path) -> tuple[Held, set[str]]:
    """target-singerlake held after its first batch's data files are written, before their commit; and those files."""
    target = Held(target_command(lake, tmp_path), "land-before-commit", cli_env(lake), stdin=landing_input())
    target.wait_paused()
    uncommitted = set(lake.data_keys())
    assert uncommitted, "the batch's data files are written before the pause"
    return target, uncommitted


@pytest.mark.heavy
def test_a_landing_held_before_its_commit_with_its_lock_live_loses_nothing(local_lake, tmp_path):
    """On local disk only: what keeps the files is the lock's freshness, which test_lock checks on every backend."""
    lake = local_lake
    target, uncommitted = held_landing(lake, tmp_path)
    vacuum_now(lake)
    assert set(lake.data_keys()) == uncommitted, "a live writer's files are left for a later pass"
    done = target.release()
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert states(done.stdout)[-1] == RECORDS
    assert [r["id"] for r in replayed(lake, tmp_path)] == list(range(1, RECORDS + 1))


@pytest.mark.heavy
def test_a_landing_whose_lock_went_stale_fails_without_acknowledging_what_vacuum_took(cli_lake, tmp_path):
    lake = cli_lake
    target, uncommitted = held_landing(lake, tmp_path)
    [lock] = lake.locks()
    make_stale(lake, lock)  # the target stalled past its lease
    vacuum_now(lake)
    assert not set(lake.data_keys()) & uncommitted, "the stalled writer's files are orphans now, and gone"
    done = target.release()
    assert done.returncode != 0, "its commit is refused: a failure, never a STATE over lost records"
    acknowledged = max(states(done.stdout), default=0)
    ids = [r["id"] for r in replayed(lake, tmp_path)]
    assert ids == list(range(1, len(ids) + 1)) and len(ids) >= acknowledged, "every record a STATE covered replays, in order"
    land(lake, tmp_path, landing_input(first=acknowledged + 1))  # Meltano resumes the tap from the last STATE
    ids = [r["id"] for r in replayed(lake, tmp_path)]
    assert sorted(set(ids)) == list(range(1, RECORDS + 1)), "the resumed run completes the lake"


# -- compaction and projection -------------------------------------------------------------------------
@pytest.mark.heavy
def test_compaction_and_projection_held_before_their_commits_fail_or_keep_their_files(tmp_path):
    lake = local_lake_at(tmp_path)
    land(lake, tmp_path, landing_input())  # three batches of BATCH_ROWS: three files to merge
    compact = Held(singerlake(lake, "compact", "--spark-master", "local[2]"), "compact-before-swap", cli_env(lake))
    compact.wait_paused()
    vacuum_now(lake)  # deletes the merged file, an orphan until the swap, and raises the horizon
    done = compact.release()
    assert done.returncode == 1 and b"deleted by a vacuum" in done.stderr, done.stderr.decode()[-3000:]
    assert [r["id"] for r in replayed(lake, tmp_path)] == list(range(1, RECORDS + 1))
    assert run(lake, "verify", "--no-hashes").returncode == 0

    assert run(lake, "project", "--spark-master", "local[2]").returncode == 0
    land(lake, tmp_path, landing_input(first=RECORDS - 9))  # ten updated keys
    from deltalake import DeltaTable

    table_path = str(Path(lake.config["lake_root"], "published", TAP, "users"))
    before = DeltaTable(table_path).version()
    project = Held(singerlake(lake, "project", "--spark-master", "local[2]"), "project-before-commit", cli_env(lake))
    project.wait_paused()
    vacuum_now(lake)  # its new files are unreferenced: deleted only after the fence commit
    done = project.release()
    # Its commit lost to the fence; planned from the table's heads, the stream is planned again from the log, after
    # the fence, in the same run (SPEC.md §12, §15): that plan's files are all written after vacuum listed its own.
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    table = DeltaTable(table_path)
    assert table.version() == before + 2, "the fence, then the second plan's commit"
    assert table.to_pyarrow_table().num_rows == RECORDS, "the table's last version reads in full"
    assert run(lake, "verify", "--no-hashes").returncode == 0

    lake.storage.delete(heads_key(TAP))  # no heads: the run plans from the log itself, and a lost commit fails
    land(lake, tmp_path, landing_input(first=RECORDS - 9))
    project = Held(singerlake(lake, "project", "--spark-master", "local[2]"), "project-before-commit", cli_env(lake))
    project.wait_paused()
    vacuum_now(lake)
    done = project.release()
    assert done.returncode == 1, done.stderr.decode()[-3000:]  # its commit lost to the fence: the stream failed
    assert DeltaTable(table_path).to_pyarrow_table().num_rows == RECORDS, "the table's last version reads in full"
    assert run(lake, "project", "--spark-master", "local[2]").returncode == 0
    assert DeltaTable(table_path).to_pyarrow_table().num_rows == RECORDS


# -- a randomised soak ---------------------------------------------------------------------------------
MIN_VACUUMS = 5  # the soak runs its loops until this many vacuum passes raced the writers


@pytest.mark.heavy
def test_soak_writers_and_a_vacuum_loop_lose_nothing_acknowledged(tmp_path):
    """Pushes, landings, compactions and projections run in loops, each a real CLI process, while
    ``vacuum --retention 0s --force --apply`` runs in a loop too. Afterwards every pushed file fetches
    byte for byte, every record a STATE covered replays and is in the projected table, and verify is clean."""
    seed = int(os.environ.get("SOAK_SEED", time.time_ns() % 1_000_000))
    seconds = float(os.environ.get("SOAK_SECONDS", "30"))
    print(f"soak seed {seed}, {seconds:.0f}s (SOAK_SEED, SOAK_SECONDS to repeat)")
    rng = random.Random(seed)
    lake = local_lake_at(tmp_path)
    env = cli_env(lake)
    deadline = time.monotonic() + seconds
    cap = deadline + HANG_S  # a slow machine runs longer to reach the vacuum passes the soak needs; a hang still ends
    pushed: dict[str, bytes] = {}
    landed: list[int] = []
    counts = {"push": 0, "land": 0, "compact": 0, "project": 0, "vacuum": 0, "failed": 0}
    lock = threading.Lock()
    errors: list[str] = []

    def loop(name: str, step) -> None:
        try:
            while time.monotonic() < deadline or (counts["vacuum"] < MIN_VACUUMS and time.monotonic() < cap):
                step()
                with lock:
                    counts[name] += 1
                time.sleep(rng.uniform(0, 0.5))
        except BaseException as exc:  # reported by the main thread
            errors.append(f"{name}: {exc!r}")

    def push_step() -> None:
        src = tmp_path / f"push-{counts['push']}"
        src.mkdir()
        batch = {f"{src.name}-{i}.bin": os.urandom(rng.choice([100, 5000, 5 << 20 if i == 0 else 200])) for i in range(20)}
        for name, data in batch.items():
            (src / name).write_bytes(data)
        done = subprocess.run(singerlake(lake, "push", str(src), *PUSH_ARGS), capture_output=True, env=env, timeout=HANG_S)
        if done.returncode == 0:
            for record in json.loads(done.stdout)["pushed"]:
                pushed[Path(record["path"]).name] = batch[Path(record["path"]).name]
        else:
            failed()

    def land_step() -> None:
        first = counts["land"] * 2000 + 1
        data = landing_input(first, first + 1999) + json.dumps({"type": "STATE", "value": {"upto": first + 1999}}).encode() + b"\n"
        command = target_command(lake, tmp_path, "soak-target", spark_master="local[1]")
        done = subprocess.run(command, input=data, capture_output=True, env=env, timeout=HANG_S)
        landed.extend(range(first, max(states(done.stdout), default=0) + 1))
        if done.returncode != 0:
            failed()

    def job_step(command: str) -> None:
        done = run(lake, command, "--spark-master", "local[1]")
        if done.returncode != 0:  # a lost race fails a stream (exit 1), never anything else
            assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
            failed()

    def failed() -> None:
        with lock:
            counts["failed"] += 1

    def vacuum_step() -> None:
        vacuum_now(lake)

    land_step()  # the stream exists before compact and project loop over it
    counts["land"] += 1
    threads = [
        threading.Thread(target=loop, args=("push", push_step)),
        threading.Thread(target=loop, args=("land", land_step)),
        threading.Thread(target=loop, args=("compact", lambda: job_step("compact"))),
        threading.Thread(target=loop, args=("project", lambda: job_step("project"))),
        threading.Thread(target=loop, args=("vacuum", vacuum_step)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"soak: {counts}, {len(pushed)} files pushed, {len(landed)} records acknowledged")
    assert not errors, errors
    assert counts["vacuum"] >= MIN_VACUUMS and pushed and landed, counts

    vacuum_now(lake)
    verify = run(lake, "verify", "--no-hashes")
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr
    out = tmp_path / "fetched"
    query = ["--what", "app-log", "--start", "2026-11-20", "--end", "2026-11-21"]
    fetched = run(lake, "files", *query, "--fetch", str(out), "--name", "{name}")
    assert fetched.returncode == 0, fetched.stderr
    assert {path.name: path.read_bytes() for path in out.iterdir()} == pushed, "every pushed file, byte for byte"
    replayed_ids = [r["id"] for r in replayed(lake, tmp_path)]
    assert set(landed) <= set(replayed_ids), "every record a STATE covered replays"
    assert run(lake, "project", "--spark-master", "local[2]").returncode == 0
    from deltalake import DeltaTable

    table = DeltaTable(str(Path(lake.config["lake_root"], "published", TAP, "users"))).to_pyarrow_table()
    assert set(landed) <= set(table.column("id").to_pylist()), "every acknowledged record is in the projected table"
