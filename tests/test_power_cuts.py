"""The lake on the power-cut file system (support/powercut_fs.py): power cut at seeded random moments while
the real commands run, each cut a snapshot of what the disk would hold then (only what was fsynced, file
and directory). A snapshot is read back as a reader would, and taken up by the next run: whatever was
acknowledged before the cut (a STATE the target emitted, a file `push` reported) is there, exactly, and
nothing half-written is visible. Set SINGERLAKE_CUT_SEED to replay a failure; the seed is in its message.
Timeouts only detect hangs; nothing here asserts speed."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from singerlake import Lake
from singerlake.storage.local import LocalStorage
from support.powercut_fs import PowerCutFS, why_unavailable
from support.target_runs import (
    HANG_S,
    SingerInput,
    TargetRun,
    assert_covered,
    assert_lake_complete,
    make_input,
    read_lake,
    run_to_end,
    state_value,
    write_config,
)

pytestmark = pytest.mark.heavy  # real target and push processes on a FUSE mount, a hundred cuts each

CUTS = 50  # at least this many per scenario
SMALL_STREAMS = tuple(f"small{n:02d}" for n in range(20))


@pytest.fixture
def seed() -> int:
    chosen = int(os.environ.get("SINGERLAKE_CUT_SEED") or random.randrange(1 << 32))
    print(f"power-cut seed: {chosen} (SINGERLAKE_CUT_SEED={chosen} replays it)")
    return chosen


@pytest.fixture
def fs(tmp_path):
    yield from mounted_on(tmp_path, tmp_path / "image")


def skip_without_fuse() -> None:
    reason = why_unavailable()
    if reason:
        pytest.skip(reason)


def mounted_on(tmp_path: Path, image: Path):
    """The power-cut file system at ``tmp_path / "mnt"``, loaded with ``image`` (all of it durable)."""
    skip_without_fuse()
    image.mkdir(exist_ok=True)
    with PowerCutFS.start(tmp_path / "mnt", image, tmp_path / "control") as mounted:
        yield mounted


def cuts_while(running, fs: PowerCutFS, rng: random.Random, out: Path, acknowledged, taken: list | None = None) -> list[tuple[Path, Any]]:
    """Snapshots at random moments while ``running()``, each with ``acknowledged()`` read just before it:
    what was acknowledged before the cut (appended to ``taken`` as they come)."""
    taken = [] if taken is None else taken
    deadline = time.monotonic() + HANG_S
    while running() and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.02, 0.25))
        before = acknowledged()
        taken.append((fs.snapshot(out / f"cut-{len(taken):03d}"), before))
    return taken


# -- landing ----------------------------------------------------------------------------------------
def big_and_small(i: int) -> str:
    """One big stream; every 25th record goes to one of 20 small streams in turn."""
    return SMALL_STREAMS[(i // 25) % len(SMALL_STREAMS)] if i % 25 == 0 else "big"


def test_a_power_cut_during_landing_loses_no_record_covered_by_an_emitted_state(fs, tmp_path, seed):
    rng = random.Random(seed)
    singer_input = make_input(tmp_path / "input.singer.jsonl", 24_000, 1_000, ("big", *SMALL_STREAMS), big_and_small)
    lake_root = fs.mount / "lake"
    config = write_config(tmp_path, "config", lake_root=str(lake_root), batch_max_rows=1_500)
    with open(singer_input.path, "rb") as stdin:
        run = TargetRun(config, stdin, tmp_path / "target.stderr")
        try:
            cuts = cuts_while(lambda: run.proc.poll() is None, fs, rng, tmp_path / "cuts", lambda: len(run.lines))
            assert run.wait() == 0, f"seed {seed}: the target failed; stderr:\n{run.stderr[-3000:]}"
        finally:
            run.cleanup()
    assert len(cuts) >= CUTS, f"seed {seed}: only {len(cuts)} cuts while the target ran: give it more input"
    assert_lake_complete(read_lake(Lake(LocalStorage(lake_root)), singer_input), singer_input)
    states = [json.loads(line) for line in run.lines]
    for snapshot, emitted in cuts:
        acknowledged = states[emitted - 1] if emitted else None
        try:
            view = read_lake(Lake(LocalStorage(snapshot / "lake")), singer_input) if (snapshot / "lake").exists() else None
            assert view is not None or acknowledged is None, "the lake is gone, a STATE was emitted"
            if view is not None:
                assert_covered(view, singer_input, acknowledged, duplicates=False)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, {snapshot.name} (after {emitted} STATEs): {exc}") from exc
    for snapshot, emitted in rng.sample(cuts, 2):  # the next run, from the last STATE before the cut, completes the lake
        acknowledged = states[emitted - 1] if emitted else None
        run_to_end(config_on(tmp_path, snapshot), singer_input.resume_after(acknowledged), tmp_path, f"resume-{snapshot.name}")
        assert_lake_complete(read_lake(Lake(LocalStorage(snapshot / "lake")), singer_input), singer_input)


def config_on(tmp_path: Path, snapshot: Path) -> Path:
    return write_config(tmp_path, f"config-{snapshot.name}", lake_root=str(snapshot / "lake"), batch_max_rows=1_500)


# -- push -------------------------------------------------------------------------------------------
SINGERLAKE = str(Path(sys.executable).with_name("singerlake"))
WHAT, WHERE = "logs", "web01"


def make_files(directory: Path, rng: random.Random, count: int, large: bool) -> dict[str, bytes]:
    """``count`` small files of random bytes (and one over the small-file size, read in chunks): name -> bytes."""
    directory.mkdir(parents=True)
    files = {f"f{n:03d}.log": rng.randbytes(rng.randrange(1, 4_000)) for n in range(count)}
    if large:
        files["large.bin"] = rng.randbytes(4_500_000)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return files


def test_a_power_cut_during_pushes_loses_no_file_a_push_reported(fs, tmp_path, seed):
    rng = random.Random(seed)
    lake_root = fs.mount / "lake"
    pushed: list[tuple[str, dict[str, bytes]]] = []  # (work id, its files), once its push has reported them
    cuts: list[tuple[Path, list]] = []

    def pushes() -> None:  # rounds of 30 small files (a large one every 8th) until the cuts are enough
        for n in itertools.count():
            if n >= 12 and len(cuts) >= CUTS:
                return
            work_id = f"round-{n:02d}"
            files = make_files(tmp_path / "src" / work_id, random.Random(f"{seed}-{n}"), 30, n % 8 == 1)
            command = [SINGERLAKE, "push", str(lake_root), str(tmp_path / "src" / work_id), "--what", WHAT, "--where", WHERE]
            done = subprocess.run(
                [*command, "--work-id", work_id, "--start", "2026-11-01T00:00:00Z", "--spark", "never", "--json"],
                capture_output=True, text=True, timeout=HANG_S,
            )  # fmt: skip
            assert done.returncode == 0, f"push {work_id}: exit {done.returncode}: {done.stderr[-2000:]}"
            pushed.append((work_id, files))

    worker = ThreadWithResult(pushes)
    cuts_while(worker.is_alive, fs, rng, tmp_path / "cuts", lambda: list(pushed), cuts)
    worker.result()
    for snapshot, reported in [*cuts, (fs.mount, pushed)]:
        try:
            assert_files_kept(snapshot / "lake", reported, tmp_path / "fetched" / snapshot.name)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, {snapshot.name} (after {len(reported)} pushes): {exc}") from exc
    lakes = [snapshot for snapshot, _ in cuts if (snapshot / "lake").exists()]
    for snapshot in rng.sample(lakes, 2):  # after repair, verify finds nothing but the cut push's leftovers (vacuum's to delete)
        root = str(snapshot / "lake")
        subprocess.run([SINGERLAKE, "repair", root, "--apply"], capture_output=True, timeout=HANG_S)
        verified = subprocess.run([SINGERLAKE, "verify", root], capture_output=True, text=True, timeout=HANG_S)
        findings = [line for line in verified.stdout.splitlines() if ": " in line]
        assert verified.returncode == 0 or (verified.returncode == 1 and all(line.startswith("orphan: ") for line in findings)), (
            f"seed {seed}, {snapshot.name}: {verified.stdout[-3000:]}{verified.stderr[-2000:]}"
        )


def assert_files_kept(root: Path, reported: list[tuple[str, dict[str, bytes]]], out: Path) -> None:
    """Each reported push's files are found by their work id and fetch byte for byte."""
    if not reported:
        return
    lake = Lake(LocalStorage(root))
    for work_id, files in reported:
        records = lake.find_files(WHAT, where=WHERE, work_id=work_id)
        assert sorted(record["name"] for record in records) == sorted(files), f"{work_id}: found {len(records)} of {len(files)} files"
        by_day = {record["id"] for record in lake.find_files(WHAT, where=WHERE, start="2026-11-01", end="2026-11-01")}
        assert {record["id"] for record in records} <= by_day, f"{work_id}: a file is not found by its day"
        target = out / work_id
        target.mkdir(parents=True)
        lake.fetch(records, str(target) + "/", template="{name}")
        for name, data in files.items():
            assert hashlib.sha256((target / name).read_bytes()).digest() == hashlib.sha256(data).digest(), f"{work_id}/{name} differs"


class ThreadWithResult:
    """A thread whose exception comes back from ``result()``."""

    def __init__(self, work) -> None:
        import threading

        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self._thread.start()

    def _run(self, work) -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self.error = exc

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def result(self) -> None:
        self._thread.join(HANG_S)
        if self.error is not None:
            raise self.error


# -- lake jobs --------------------------------------------------------------------------------------
JOB_STREAMS = ("big", "small00", "small01")
JOB_RECORDS, HALF = 6_000, 3_000  # the first landing ends with the STATE at HALF, the second brings the rest


def three_streams(i: int) -> str:
    return JOB_STREAMS[1 + (i // 7) % 2] if i % 7 == 0 else "big"


def delta_rows(table: Path) -> int | None:
    """The rows of the Delta table at ``table``, every file it names read whole (None: no table yet)."""
    from deltalake import DeltaTable

    if not any((table / "_delta_log").glob("*.json")):
        return None
    return DeltaTable(str(table)).to_pyarrow_table().num_rows


def prepare(job: str, lake: Path) -> None:
    """What the job needs to find: small files to compact; files a compaction replaced, for vacuum; a lost catalogue, for repair."""
    if job == "vacuum":
        run_job("compact", lake)
    if job == "repair":
        for name in ("singerlake.json", "raw/tap-crash/catalogue.json"):
            (lake / name).unlink(missing_ok=True)
        descriptor = os.open(lake / "raw" / "tap-crash", os.O_RDONLY)  # the deletes made durable: the job starts from them
        os.fsync(descriptor)
        os.close(descriptor)


def run_job(job: str, lake: Path) -> subprocess.CompletedProcess:
    extra = {"project": ["--formats", "delta"], "vacuum": ["--retention", "0s", "--force", "--apply"], "repair": ["--apply"]}.get(job, [])
    done = subprocess.run([SINGERLAKE, job, str(lake), *extra], capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, f"{job}: exit {done.returncode}: {done.stderr[-3000:]}"
    return done


def job_input(directory: Path) -> SingerInput:
    return make_input(directory / "input.singer.jsonl", JOB_RECORDS, 500, JOB_STREAMS, three_streams)


@pytest.fixture(scope="module")
def first_landing(tmp_path_factory) -> Path:
    """The job scenarios' first landing (the input's first half), landed once for the module, off the mount: a
    landing that is not cut is the same on any disk, and each scenario's mount starts from a copy of it."""
    skip_without_fuse()  # before a landing no scenario could use
    work = tmp_path_factory.mktemp("first-landing")
    singer_input = job_input(work)
    config = write_config(work, "config", lake_root=str(work / "image" / "lake"), batch_max_rows=200)
    run_to_end(config, singer_input.lines[: singer_input.state_index[HALF] + 1], work, "land-0")
    return work / "image"


@pytest.fixture
def landed_fs(tmp_path, first_landing):
    shutil.copytree(first_landing, tmp_path / "image")
    yield from mounted_on(tmp_path, tmp_path / "image")


def job_rounds(fs: PowerCutFS, tmp_path: Path, rng: random.Random, singer_input: SingerInput, job, prepare, after) -> tuple[list, list]:
    """Rounds of ``prepare()`` then ``job()``, cut at random moments, on the first half of the input (landed when the
    mount started), then again after the rest is landed (not cut), then ``job()`` alone, until the cuts are enough.
    Returns the cuts, each with its round, and ``after()`` of each round."""
    cuts: list[tuple[Path, int]] = []
    found = []
    for round_number in itertools.count():
        landed = functools.partial(int, round_number)  # what a cut of this round holds, read when it is taken
        if round_number >= 2 and len(cuts) >= CUTS:
            break
        if round_number < 2:
            if round_number == 1:
                config = write_config(tmp_path, "config", lake_root=str(fs.mount / "lake"), batch_max_rows=200)
                run_to_end(config, singer_input.resume_after(state_value(HALF, JOB_STREAMS)), tmp_path, "land-1")
            prepare()
            fs.settle()  # the job's cuts test the job: what it starts from is on disk
        worker = ThreadWithResult(job)
        cuts_while(worker.is_alive, fs, rng, tmp_path / "cuts", landed, cuts)
        worker.result()
        found.append(after())
    return cuts, found


def landed_in(singer_input: SingerInput, round_number: int) -> dict:
    """The last STATE of what was landed before that round's job."""
    return state_value(HALF if round_number == 0 else JOB_RECORDS, JOB_STREAMS)


@pytest.mark.parametrize("job", ["compact", "project", "vacuum", "repair"])
def test_a_power_cut_during_a_lake_job_leaves_its_previous_or_next_state(landed_fs, tmp_path, seed, job):
    """Each cut holds every landed record, each manifest naming only whole files; the table is absent or whole,
    as one of the job's runs left it."""
    fs = landed_fs
    lake, table = fs.mount / "lake", fs.mount / "lake" / "published" / "tap-crash" / "big"
    singer_input = job_input(tmp_path)
    cuts, table_rows = job_rounds(
        fs, tmp_path, random.Random(seed), singer_input, lambda: run_job(job, lake), lambda: prepare(job, lake),
        lambda: delta_rows(table) if job == "project" else None,
    )  # fmt: skip
    for snapshot, round_number in cuts:
        try:
            view = read_lake(Lake(LocalStorage(snapshot / "lake")), singer_input)
            assert_covered(view, singer_input, landed_in(singer_input, round_number), duplicates=False)
            if job == "repair":
                Lake(LocalStorage(snapshot / "lake")).catalogue("tap-crash")  # parses, or is rebuilt from the manifests
            rows = delta_rows(snapshot / "lake" / "published" / "tap-crash" / "big")
            assert rows in [None, *table_rows], f"the big stream's table has {rows} rows, no run left it so ({table_rows})"
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, {snapshot.name} (round {round_number}): {exc}") from exc
    assert_lake_complete(read_lake(Lake(LocalStorage(lake)), singer_input), singer_input)


def iceberg_rows(mount: Path) -> int | None:
    """The rows of the big stream's Iceberg table in the SQLite catalog under ``mount``, every file read (None: no table yet)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    if not (mount / "catalog.db").exists():
        return None
    catalog = SqlCatalog("lake", uri=f"sqlite:///{mount}/catalog.db", warehouse=f"file://{mount}/warehouse")
    try:
        return catalog.load_table(("tap-crash", "big")).scan().to_arrow().num_rows
    except NoSuchTableError:
        return None


def test_a_power_cut_during_an_iceberg_projection_leaves_its_previous_or_next_table(landed_fs, tmp_path, seed, monkeypatch):
    """The same rounds with `project --formats iceberg`, the SQLite catalog on the mount too. A cut is mounted
    again where the lake was (the catalog names files by their path) and its tables read whole."""
    fs = landed_fs
    lake = fs.mount / "lake"
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", f"sqlite:///{fs.mount}/catalog.db")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__WAREHOUSE", f"file://{fs.mount}/warehouse")
    singer_input = job_input(tmp_path)
    command = [SINGERLAKE, "project", str(lake), "--formats", "iceberg", "--iceberg-catalog", "lake"]
    cuts, table_rows = job_rounds(
        fs, tmp_path, random.Random(seed), singer_input, lambda: subprocess.run(command, check=True, capture_output=True, timeout=HANG_S),
        lambda: None, lambda: iceberg_rows(fs.mount),
    )  # fmt: skip
    allowed = [None, 0, *table_rows]  # none yet; created empty by the first run, which then adds its snapshot
    fs.stop()
    for snapshot, round_number in cuts:
        with PowerCutFS.start(fs.mount, snapshot, tmp_path / "control-check"):
            try:
                rows = iceberg_rows(fs.mount)
                assert rows in allowed, f"the big stream's Iceberg table has {rows} rows, no run left it so ({table_rows})"
                assert delta_rows(lake / "published" / "tap-crash" / "big") in allowed
            except Exception as exc:
                raise AssertionError(f"seed {seed}, {snapshot.name} (round {round_number}): {exc}") from exc
