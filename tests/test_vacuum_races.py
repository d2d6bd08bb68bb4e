"""Vacuum racing live writers (SPEC.md §15): what a writer may still commit is never deleted.

Each test holds a real CLI process at a named step (``SINGERLAKE_PAUSE_AT``: it stops itself with
SIGSTOP there), runs the real ``singerlake vacuum`` meanwhile, then lets the writer go on. Either the
writer fails loudly and acknowledges nothing, or everything it acknowledges ("pushed", a STATE)
reads back exactly. Local lakes and SeaweedFS; timeouts only detect hangs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import _new_bucket
from lakes import CLI as TARGET_CLI
from lakes import TAP, LakeUnderTest, local_lake_at, s3_lake_at
from singerlake.commits.lock import LockInfo
from singerlake.lake import Lake
from singerlake.times import iso_ms, now_ms

HANG_S = 300  # hang detector, not a speed limit
SINGERLAKE = [sys.executable, "-m", "singerlake.cli"]
TAP_CLI = str(Path(sys.executable).with_name("tap-singerlake"))
LONG_AGO_MS = 10 * 86_400_000


@pytest.fixture(params=["local", "seaweedfs"])
def lake(request, tmp_path) -> LakeUnderTest:
    if request.param == "local":
        return local_lake_at(tmp_path)
    return s3_lake_at(_new_bucket(request, request.getfixturevalue("seaweedfs_server")))


def cli_env(lake: LakeUnderTest, **extra: str) -> dict:
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true", **extra}
    env.pop("SINGERLAKE_PAUSE_AT", None)
    if "s3_access_key_id" in lake.config:
        env.update(AWS_ACCESS_KEY_ID=lake.config["s3_access_key_id"], AWS_SECRET_ACCESS_KEY=lake.config["s3_secret_access_key"])
    return {**env, **extra}


def singerlake(lake: LakeUnderTest, command: str, *args: str) -> list[str]:
    """The argv of ``singerlake COMMAND ROOT [S3 options] ARGS``."""
    s3 = []
    if "s3_endpoint_url" in lake.config:
        s3 = ["--s3-endpoint-url", lake.config["s3_endpoint_url"], "--s3-region", lake.config["s3_region"]]
    return [*SINGERLAKE, command, lake.config["lake_root"], *s3, *args]


def run(lake: LakeUnderTest, command: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(singerlake(lake, command, *args), capture_output=True, text=True, env=cli_env(lake), timeout=HANG_S)


def vacuum_now(lake: LakeUnderTest, *args: str) -> subprocess.CompletedProcess:
    done = run(lake, "vacuum", "--retention", "0s", "--force", "--apply", *args)
    assert done.returncode == 0, done.stderr
    return done


class Held:
    """A real process stopped at a pause point while the test acts, then let go (SIGCONT)."""

    def __init__(self, command: list[str], point: str, env: dict, stdin: bytes | None = None):
        self.point = point
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**env, "SINGERLAKE_PAUSE_AT": point},
        )
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.paused = threading.Event()
        self.threads = [threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True)]
        self.threads.append(threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True))
        if stdin is not None:
            self.threads.append(threading.Thread(target=self._feed, args=(stdin,), daemon=True))
        for thread in self.threads:
            thread.start()

    def _read(self, stream, lines: list[bytes]) -> None:
        for line in stream:
            lines.append(line)
            if f"paused at {self.point}".encode() in line:
                self.paused.set()

    def _feed(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # the process ended early: its exit code tells

    def wait_paused(self) -> Held:
        if not self.paused.wait(HANG_S):
            self.proc.kill()
            pytest.fail(f"never reached {self.point}; stderr:\n{b''.join(self.err).decode()[-3000:]}")
        while _state(self.proc.pid) != "T":  # the line is printed just before the SIGSTOP
            time.sleep(0.01)
        return self

    def release(self) -> subprocess.CompletedProcess:
        os.kill(self.proc.pid, signal.SIGCONT)
        return self.finish()

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.finish()

    def finish(self) -> subprocess.CompletedProcess:
        self.proc.wait(HANG_S)
        for thread in self.threads:
            thread.join(HANG_S)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, b"".join(self.out), b"".join(self.err))


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


def make_stale(lake: LakeUnderTest, key: str, ago_ms: int = 3_600_000) -> None:
    """Rewrite a lock or lease as its holder would have left it ``ago_ms`` ago: how it reads once its
    holder stalled (or died) for that long."""
    info = LockInfo.parse(lake.read(key))
    then = iso_ms(now_ms() - ago_ms)
    body = {"writer-id": info.writer_id, "acquired": then, "refreshed": then, "lease_seconds": info.lease_s}
    lake.storage.write(key, json.dumps(body).encode())


# -- pushes ----------------------------------------------------------------------------------------
def files_to_push(tmp_path: Path) -> dict[str, bytes]:
    """A large file (streamed in parts) and a small one (read whole)."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    files = {"big.bin": os.urandom(6 << 20), "small.txt": b"a small file\n" * 100}
    for name, data in files.items():
        (src / name).write_bytes(data)
    return files


PUSH_ARGS = ["--what", "app-log", "--where", "web01", "--start", "2026-11-20T10:00:00Z", "--json"]


def push(lake: LakeUnderTest, tmp_path: Path, point: str) -> Held:
    return Held(singerlake(lake, "push", str(tmp_path / "src"), *PUSH_ARGS), point, cli_env(lake)).wait_paused()


def check_pushed(lake: LakeUnderTest, tmp_path: Path, done: subprocess.CompletedProcess, files: dict[str, bytes]) -> None:
    """The push acknowledged every file once, and each reads back."""
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    assert sorted(Path(r["path"]).name for r in result["pushed"] + result["duplicates"]) == sorted(files)
    check_readable(lake, tmp_path, files)


def check_readable(lake: LakeUnderTest, tmp_path: Path, files: dict[str, bytes]) -> None:
    """Each file is found by its day and fetched byte for byte, and verify is clean."""
    found = {r["name"]: r["id"] for r in Lake(lake.storage).find_files("app-log", start="2026-11-20", end="2026-11-21")}
    assert sorted(found) == sorted(files), "every acknowledged file is found by its day"
    out = tmp_path / f"fetched-{time.monotonic_ns()}"
    fetched = run(lake, "fetch", *found.values(), "--out", str(out), "--name", "{name}")
    assert fetched.returncode == 0, fetched.stderr
    for name, data in files.items():
        assert (out / name).read_bytes() == data, f"{name} comes back byte for byte"
    verify = run(lake, "verify", "--no-hashes")
    assert verify.returncode == 0, verify.stdout + verify.stderr


def pending_leases(lake: LakeUnderTest) -> list[str]:
    return lake.keys("files/index/app-log/pending/")  # SPEC.md §15


def test_a_push_held_before_its_commit_keeps_its_files_through_a_vacuum(lake, tmp_path):
    files = files_to_push(tmp_path)
    held = push(lake, tmp_path, "push-before-commit")
    vacuumed = vacuum_now(lake)
    check_pushed(lake, tmp_path, held.release(), files)
    assert "push is under way" in vacuumed.stdout, vacuumed.stdout  # its lease was live: the what waited for a later pass
    assert pending_leases(lake) == [], "the push drops its lease once committed"


def test_a_push_whose_lease_went_stale_is_aborted_and_stores_its_files_again(lake, tmp_path):
    files = files_to_push(tmp_path)
    held = push(lake, tmp_path, "push-before-commit")
    [lease] = pending_leases(lake)
    make_stale(lake, lease)  # the push stalled past its lease: vacuum may take what it stored
    vacuumed = vacuum_now(lake)
    deleted = [line for line in vacuumed.stdout.splitlines() if line.startswith("files/data/")]
    assert len(deleted) == 2, vacuumed.stdout  # both files' bytes went
    check_pushed(lake, tmp_path, held.release(), files)  # its commit failed, so it stored them again under a new txn


def test_bytes_stored_long_ago_and_found_by_a_live_push_are_kept(lake, tmp_path):
    """A push killed before its commit left the file's bytes; much later the same file is pushed again,
    finds them stored (a create-only write that fails) and is held before its commit while vacuum runs
    with the default retention: the old bytes are the live push's now."""
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


def test_a_push_into_a_new_what_killed_before_its_pointers_is_reported_and_removed(lake, tmp_path):
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


def test_a_retention_under_an_hour_is_refused_unless_forced(lake, tmp_path):
    files_to_push(tmp_path)
    assert run(lake, "push", str(tmp_path / "src"), *PUSH_ARGS).returncode == 0
    refused = run(lake, "vacuum", "--retention", "30m", "--apply")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "retention" in refused.stderr and "--force" in refused.stderr and "Traceback" not in refused.stderr
    assert run(lake, "vacuum", "--retention", "30m", "--apply", "--force").returncode == 0


VACUUM_LOOPS = 3  # vacuums side by side, each a CLI process after the other: some always between a push's looks


@pytest.mark.heavy
def test_pushes_racing_a_vacuum_loop_lose_nothing(lake, tmp_path):
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


# -- landing ---------------------------------------------------------------------------------------
RECORDS, STATE_EVERY, BATCH_ROWS = 60_000, 10_000, 20_000
USERS = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}


def landing_input(first: int = 1, last: int = RECORDS) -> bytes:
    """SCHEMA, then records ``first``..``last`` with a STATE after every STATE_EVERY."""
    lines = [json.dumps({"type": "SCHEMA", "stream": "users", "schema": USERS, "key_properties": ["id"]}).encode()]
    for i in range(first, last + 1):
        lines.append(json.dumps({"type": "RECORD", "stream": "users", "record": {"id": i, "name": f"user {i}"}}).encode())
        if i % STATE_EVERY == 0:
            lines.append(json.dumps({"type": "STATE", "value": {"upto": i}}).encode())
    return b"\n".join(lines) + b"\n"


def land(lake: LakeUnderTest, tmp_path: Path, data: bytes) -> None:
    done = subprocess.run(target_command(lake, tmp_path), input=data, capture_output=True, env=cli_env(lake), timeout=HANG_S)
    assert done.returncode == 0, done.stderr.decode()[-3000:]


def target_command(lake: LakeUnderTest, tmp_path: Path, name: str = "target", **settings) -> list[str]:
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps({**lake.config, "batch_max_rows": BATCH_ROWS, "spark_master": "local[2]", **settings}))
    return [TARGET_CLI, "--config", str(config)]


def replayed(lake: LakeUnderTest, tmp_path: Path) -> list[bytes]:
    """The RECORD messages tap-singerlake replays, as their records' JSON."""
    config = tmp_path / "tap.json"
    config.write_text(json.dumps(lake.config))
    done = subprocess.run([TAP_CLI, "--config", str(config)], capture_output=True, env=cli_env(lake), timeout=HANG_S)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return [json.loads(line)["record"] for line in done.stdout.splitlines() if json.loads(line)["type"] == "RECORD"]


def states(out: bytes) -> list[int]:
    """The STATE values a target emitted (a target writes each value alone on a line)."""
    return [json.loads(line)["upto"] for line in out.splitlines() if line.strip()]


@pytest.mark.heavy
def test_a_landing_held_before_its_commit_with_its_lock_live_loses_nothing(lake, tmp_path):
    target = Held(target_command(lake, tmp_path), "land-before-commit", cli_env(lake), stdin=landing_input())
    target.wait_paused()
    uncommitted = set(lake.data_keys())
    assert uncommitted, "the batch's data files are written before the pause"
    vacuum_now(lake)
    assert set(lake.data_keys()) == uncommitted, "a live writer's files are left for a later pass"
    done = target.release()
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert states(done.stdout)[-1] == RECORDS
    assert [r["id"] for r in replayed(lake, tmp_path)] == list(range(1, RECORDS + 1))


@pytest.mark.heavy
def test_a_landing_whose_lock_went_stale_fails_without_acknowledging_what_vacuum_took(lake, tmp_path):
    target = Held(target_command(lake, tmp_path), "land-before-commit", cli_env(lake), stdin=landing_input())
    target.wait_paused()
    uncommitted = set(lake.data_keys())
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
    for first in range(1, RECORDS, BATCH_ROWS):  # three landings: three files to merge
        land(lake, tmp_path, landing_input(first, first + BATCH_ROWS - 1))
    compact = Held(singerlake(lake, "compact", "--spark-master", "local[2]"), "compact-before-swap", cli_env(lake))
    compact.wait_paused()
    vacuum_now(lake)  # deletes the merged file, an orphan until the swap, and raises the horizon
    done = compact.release()
    assert done.returncode == 1 and b"deleted by a vacuum" in done.stderr, done.stderr.decode()[-3000:]
    assert [r["id"] for r in replayed(lake, tmp_path)] == list(range(1, RECORDS + 1))
    assert run(lake, "verify", "--no-hashes").returncode == 0

    assert run(lake, "project", "--spark-master", "local[2]").returncode == 0
    land(lake, tmp_path, landing_input(first=RECORDS - 9))  # ten updated keys
    project = Held(singerlake(lake, "project", "--spark-master", "local[2]"), "project-before-commit", cli_env(lake))
    project.wait_paused()
    vacuum_now(lake)  # its new files are unreferenced: deleted only after the fence commit
    done = project.release()
    assert done.returncode == 1, done.stderr.decode()[-3000:]  # its commit lost to the fence: the stream failed
    from deltalake import DeltaTable

    table = DeltaTable(str(Path(lake.config["lake_root"], "published", TAP, "users")))
    assert table.to_pyarrow_table().num_rows == RECORDS, "the table's last version reads in full"
    assert run(lake, "project", "--spark-master", "local[2]").returncode == 0
    assert DeltaTable(str(Path(lake.config["lake_root"], "published", TAP, "users"))).to_pyarrow_table().num_rows == RECORDS


# -- a randomised soak ---------------------------------------------------------------------------------
@pytest.mark.heavy
def test_soak_writers_and_a_vacuum_loop_lose_nothing_acknowledged(tmp_path):
    """Pushes, landings, compactions and projections run in loops, each a real CLI process, while
    ``vacuum --retention 0s --force --apply`` runs in a loop too. Afterwards every pushed file fetches
    byte for byte, every record a STATE covered replays and is in the projected table, and verify is clean."""
    seed = int(os.environ.get("SOAK_SEED", time.time_ns() % 1_000_000))
    seconds = float(os.environ.get("SOAK_SECONDS", "90"))
    print(f"soak seed {seed}, {seconds:.0f}s (SOAK_SEED, SOAK_SECONDS to repeat)")
    rng = __import__("random").Random(seed)
    lake = local_lake_at(tmp_path)
    env = cli_env(lake)
    deadline = time.monotonic() + seconds
    pushed: dict[str, bytes] = {}
    landed: list[int] = []
    counts = {"push": 0, "land": 0, "compact": 0, "project": 0, "vacuum": 0, "failed": 0}
    lock = threading.Lock()
    errors: list[str] = []

    def loop(name: str, step) -> None:
        try:
            while time.monotonic() < deadline:
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
    assert counts["vacuum"] >= 5 and pushed and landed, counts

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


def test_a_vacuum_stalled_before_its_deletes_deletes_nothing_once_a_push_took_its_lock_over(lake, tmp_path):
    """A dead push left a file's bytes; vacuum judges them leftovers and stalls before deleting; the same
    file is pushed again, finds the stalled vacuum's lock stale, takes it over and reuses the bytes. The
    vacuum, let go, finds its lock gone and deletes nothing."""
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
