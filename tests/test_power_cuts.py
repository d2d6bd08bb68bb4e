"""The lake on the power-cut file system (support/powercut_fs.py): power cut at seeded random moments while
the real commands run, each cut a snapshot of what the disk would hold then (only what was fsynced, file
and directory). A snapshot is read back as a reader would, and taken up by the next run: whatever was
acknowledged before the cut (a STATE the target emitted, a file `push` reported) is there, exactly, and
nothing half-written is visible. Set SINGERLAKE_CUT_SEED to replay a failure; the seed is in its message.
Timeouts only detect hangs; nothing here asserts speed."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

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
    reason = why_unavailable()
    if reason:
        pytest.skip(reason)
    image = tmp_path / "image"
    image.mkdir()
    with PowerCutFS.start(tmp_path / "mnt", image, tmp_path / "control") as mounted:
        yield mounted


def cuts_while(running, fs: PowerCutFS, rng: random.Random, out: Path, acknowledged) -> list[tuple[Path, object]]:
    """Snapshots at random moments while ``running()``, each with ``acknowledged()`` read just before it:
    what was acknowledged before the cut."""
    taken: list[tuple[Path, object]] = []
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
