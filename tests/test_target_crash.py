"""target-singerlake as a real process that dies: SIGKILL at several points, SIGTERM, Spark failures.

Every run is the real ``target-singerlake`` command with Spark local mode. After a crash the lake
is read back as a reader would (``Lake``): nothing partial is visible, nothing covered by an
emitted STATE is lost, files of the dead writer stay invisible, and a rerun from the last emitted
STATE (what Meltano does) completes the lake: every input record at least once, in input order
per stream once duplicates are dropped. Timeouts here only detect hangs; nothing asserts speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from singerlake import Lake
from singerlake.format.layout import StreamPaths
from support.processes import descendants, reap
from support.target_runs import (
    HANG_S,
    STATE_EVERY,
    STREAMS,
    TAP,
    SingerInput,
    TargetRun,
    assert_covered,
    assert_lake_complete,
    make_input,
    read_lake,
    run_to_end,
    write_config,
)

pytestmark = pytest.mark.heavy  # kill -9 and SIGTERM of real target processes, repeated


# -- input (support.target_runs) ----------------------------------------------------------------------
# -- input -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def singer_input(tmp_path_factory) -> SingerInput:
    return make_input(tmp_path_factory.mktemp("input") / "input.singer.jsonl")


# -- crash: SIGKILL, then resume ------------------------------------------------------------------
def uncommitted(root: Path) -> set[str]:
    """Data files on disk that no manifest lists yet (manifests read first)."""
    committed: set[str] = set()
    on_disk: set[str] = set()
    for stream in STREAMS:
        paths = StreamPaths(TAP, stream)
        try:
            committed |= {entry["path"] for entry in json.loads((root / paths.manifest).read_bytes())["files"]}
        except FileNotFoundError:
            pass
    for stream in STREAMS:
        stream_dir = root / StreamPaths(TAP, stream).stream_dir
        if stream_dir.is_dir():
            for schema_dir in stream_dir.iterdir():
                if schema_dir.is_dir():
                    on_disk |= {
                        f"{StreamPaths(TAP, stream).stream_dir}/{schema_dir.name}/{name}"
                        for name in os.listdir(schema_dir)
                        if name.endswith(".singer.gz") and not name.startswith(".")
                    }
    return on_disk - committed


def kill_between_write_and_commit(run: TargetRun, root: Path) -> set[str]:
    """SIGKILL while a batch's data files are written but not committed; returns those files.

    Poll for a data file no manifest lists, freeze the driver (the only process that commits)
    with SIGSTOP, confirm the file is still uncommitted, then kill everything.
    """
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        assert run.proc.poll() is None, f"target ended before a drain could be caught; stderr:\n{run.stderr[-3000:]}"
        if uncommitted(root):
            os.kill(run.proc.pid, signal.SIGSTOP)
            time.sleep(0.3)  # a commit already in its rename has landed; no other can start
            orphans = uncommitted(root)
            if orphans:
                run.crash()
                return orphans
            os.kill(run.proc.pid, signal.SIGCONT)
        time.sleep(0.002)
    pytest.fail("no drain caught between write and commit (hang?)")


@pytest.mark.parametrize("kill_at", ["first-state", "third-state", "mid-drain"])
def test_sigkill_loses_nothing_committed_and_a_resumed_run_completes_the_lake(singer_input, tmp_path, kill_at):
    root = tmp_path / "lake"
    config = write_config(tmp_path, "config", lake_root=str(root))
    lake = Lake.open(str(root))

    with open(singer_input.path, "rb") as stdin:
        run = TargetRun(config, stdin, tmp_path / "crashed.stderr")
        try:
            if kill_at == "mid-drain":
                run.wait_for_states(2)
                caught = kill_between_write_and_commit(run, root)
            else:
                run.wait_for_states(1 if kill_at == "first-state" else 3)
                run.crash()
                caught = set()
        finally:
            run.cleanup()
    assert run.proc.returncode == -signal.SIGKILL, "the target ended before it could be killed"

    # Only STATE messages on stdout, each one of the input's, in input order.
    emitted = run.states()
    assert emitted and all(state in singer_input.states for state in emitted)
    assert [s["position"] for s in emitted] == sorted(s["position"] for s in emitted)
    last = emitted[-1]

    # (a) nothing partial visible, (b) nothing covered by the last emitted STATE lost.
    view = read_lake(lake, singer_input)
    assert_covered(view, singer_input, last, duplicates=False)
    assert caught <= view.orphans, "files written but not committed before the kill became visible"
    if kill_at == "mid-drain":
        assert caught, "the kill was meant to leave written but uncommitted files"
    assert view.locks, "a killed writer cannot have released its locks"  # else the rerun below tests no takeover

    # (c) resume from the last emitted STATE, as Meltano does; the dead writer's locks are taken over.
    rerun = run_to_end(config, singer_input.resume_after(last), tmp_path, "resumed")
    resumed_states = rerun.states()
    assert resumed_states, "the resumed run emitted no STATE"
    assert resumed_states[-1] == singer_input.states[-1]
    assert all(state["position"] > last["position"] for state in resumed_states)

    final = read_lake(lake, singer_input)
    assert_lake_complete(final, singer_input)  # at least once, in input order per stream
    assert view.orphans <= final.orphans, "the resumed run adopted files of the killed writer"
    for stream in STREAMS:
        visible = {entry["path"] for entry in lake.manifest(TAP, stream).files}
        assert not visible & view.orphans
    assert not final.locks, f"locks left after a clean run: {final.locks}"


# -- SIGTERM ---------------------------------------------------------------------------------------
def test_sigterm_commits_what_was_read_emits_its_state_and_exits_zero(singer_input, tmp_path):
    """SIGTERM while the tap is still connected: stop reading, commit, emit the STATE, exit 0."""
    root = tmp_path / "lake"
    config = write_config(tmp_path, "config", lake_root=str(root))
    second = singer_input.state_index[2 * STATE_EVERY]
    offered = singer_input.lines[: second + 1 + 1234]  # two STATEs and part of the next batch

    run = TargetRun(config, subprocess.PIPE, tmp_path / "terminated.stderr")

    def feed() -> None:
        try:
            run.proc.stdin.write(b"".join(offered))
            run.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the target stopped reading: expected after SIGTERM

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        run.wait_for_states(1)
        children = descendants(run.proc.pid)
        run.proc.send_signal(signal.SIGTERM)  # stdin stays open: only the signal can end this run
        try:
            code = run.proc.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"target ignored SIGTERM for {HANG_S}s; stderr:\n{run.stderr[-3000:]}")
        run.finish_reading()
        reap(children)
    finally:
        run.cleanup()
        try:
            run.proc.stdin.close()
        except OSError:
            pass
    assert code == 0, f"exit {code} after SIGTERM; stderr:\n{run.stderr[-5000:]}"
    assert not run.partial, f"a cut line on stdout: {run.partial!r}"

    emitted = run.states()
    assert emitted, "no STATE emitted"
    last = emitted[-1]  # the last line printed is a STATE of the input, among those offered
    assert last in singer_input.states and last["position"] <= 2 * STATE_EVERY

    view = read_lake(Lake.open(str(root)), singer_input)
    assert_covered(view, singer_input, last, duplicates=False)
    assert not view.orphans
    assert not view.locks, f"locks left after SIGTERM: {view.locks}"


# -- Spark failures --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "settings, reason",
    [
        ({"spark_conf": {"spark.driver.memory": "1k"}}, "heap"),
        ({"spark_master": "nonsense://x", "lake_root_shared": True}, "Master must"),
    ],
    ids=["driver-memory-1k", "bad-master"],
)
def test_spark_that_cannot_start_fails_the_run_clearly(singer_input, tmp_path, settings, reason):
    root = tmp_path / "lake"
    config = write_config(tmp_path, "config", lake_root=str(root), **settings)
    with open(singer_input.path, "rb") as stdin:
        run = TargetRun(config, stdin, tmp_path / "failed.stderr")
        try:
            code = run.wait()
        finally:
            run.cleanup()
    assert code != 0
    stderr = run.stderr
    assert "Spark failed to start" in stderr and reason in stderr, stderr[-5000:]
    if "spark_conf" in settings:  # the user's own Spark settings are named as the cause
        assert "setting 'spark_conf'" in stderr, stderr[-5000:]
    assert run.lines == [], "a STATE was emitted although nothing was committed"
    view = read_lake(Lake.open(str(root)), singer_input)
    assert not any(view.records.values()) and not view.orphans
    assert not view.locks, f"locks left after a failed run: {view.locks}"


def test_spark_dying_mid_run_fails_the_run_and_keeps_what_was_committed(singer_input, tmp_path):
    """The Spark JVM is killed after the first STATE; more input follows: exit non-zero, never hang."""
    root = tmp_path / "lake"
    config = write_config(tmp_path, "config", lake_root=str(root))
    pause = singer_input.state_index[2 * STATE_EVERY] + 1
    resume = threading.Event()
    run = TargetRun(config, subprocess.PIPE, tmp_path / "jvm-killed.stderr")

    def feed() -> None:
        try:
            run.proc.stdin.write(b"".join(singer_input.lines[:pause]))
            run.proc.stdin.flush()
            resume.wait(HANG_S)
            run.proc.stdin.write(b"".join(singer_input.lines[pause:]))
            run.proc.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the target stopped reading after the failure

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        run.wait_for_states(1)
        jvms = [pid for pid in descendants(run.proc.pid) if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/java")]
        assert jvms, "no Spark JVM under the target"
        for pid in jvms:
            os.kill(pid, signal.SIGKILL)
        resume.set()
        code = run.wait()
    finally:
        resume.set()
        run.cleanup()
    assert code != 0, f"exit 0 although Spark died mid-run; stderr:\n{run.stderr[-3000:]}"
    assert "landing failed" in run.stderr, run.stderr[-5000:]
    emitted = run.states()
    assert emitted and emitted[-1]["position"] < singer_input.states[-1]["position"]
    view = read_lake(Lake.open(str(root)), singer_input)
    assert_covered(view, singer_input, emitted[-1], duplicates=False)
    assert not view.locks, f"locks left after a failed run: {view.locks}"


def test_jvm_output_goes_to_stderr_never_between_state_lines(singer_input, tmp_path):
    """stdout carries Singer messages only: what the Spark JVM prints (here GC logging) goes to stderr."""
    root = tmp_path / "lake"
    config = write_config(tmp_path, "config", lake_root=str(root), spark_conf={"spark.driver.extraJavaOptions": "-verbose:gc"})
    lines = singer_input.lines[: singer_input.state_index[2 * STATE_EVERY] + 1]
    run = run_to_end(config, lines, tmp_path, "gc-logging")
    assert "[gc" in run.stderr, "the JVM's GC log should have been printed (to stderr)"
    assert "Using Spark's default log4j profile" not in run.stderr, "the user's JVM options replaced ours (log4j layout)"
    assert [json.loads(line) for line in run.lines] == singer_input.states[:2]
