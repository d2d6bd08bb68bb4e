"""target-singerlake as a real process that dies: SIGKILL at several points, SIGTERM, Spark failures.

Every run is the real ``target-singerlake`` command with Spark local mode. After a crash the lake
is read back as a reader would (``Lake``): nothing partial is visible, nothing covered by an
emitted STATE is lost, files of the dead writer stay invisible, and a rerun from the last emitted
STATE (what Meltano does) completes the lake: every input record at least once, in input order
per stream once duplicates are dropped. Timeouts here only detect hangs; nothing asserts speed.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from singerlake import Lake
from singerlake.format.layout import StreamPaths

pytestmark = pytest.mark.heavy  # kill -9 and SIGTERM of real target processes, repeated

TARGET = str(Path(sys.executable).with_name("target-singerlake"))
TAP = "tap-crash"
STREAMS = ("users", "orders")
RECORDS = 30_000  # 6 STATEs, 8 batches: the third-STATE kill still leaves half the input for the resumed run
STATE_EVERY = 5_000
BATCH_ROWS = 4_000  # not a divisor of STATE_EVERY: most STATEs travel with the batch after them
HANG_S = 300  # hang detector, not a speed limit

# A crashed writer's lock is taken over after lease + drift: keep the rerun's wait short.
BASE_CONFIG = {
    "tap_id": TAP,
    "batch_max_rows": BATCH_ROWS,
    "lock_lease_seconds": 2,
    "lock_drift_seconds": 1,
}


# -- input -----------------------------------------------------------------------------------------
def schema_line(stream: str) -> bytes:
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "payload": {"type": "string"},
            "at": {"type": "string", "format": "date-time"},
        },
    }
    return json.dumps({"type": "SCHEMA", "stream": stream, "key_properties": ["id"], "schema": schema}).encode() + b"\n"


def state_value(position: int) -> dict:
    return {"bookmarks": {stream: {"id": position} for stream in STREAMS}, "position": position}


@dataclass
class SingerInput:
    """Two interleaved streams, a STATE every STATE_EVERY records; the exact lines fed to the target."""

    lines: list[bytes]
    path: Path
    per_stream: dict[str, list[bytes]] = field(default_factory=dict)  # RECORD lines, in input order
    state_index: dict[int, int] = field(default_factory=dict)  # STATE position -> line index

    @property
    def states(self) -> list[dict]:
        return [state_value(position) for position in sorted(self.state_index)]

    def resume_after(self, state: dict | None) -> list[bytes]:
        """What a resumed tap sends: its SCHEMA messages, then everything after that STATE."""
        if state is None:
            return self.lines
        start = self.state_index[state["position"]] + 1
        return [schema_line(stream) for stream in STREAMS] + self.lines[start:]

    def covered_by(self, state: dict | None) -> dict[str, list[bytes]]:
        """Per stream, the records that came before ``state`` in the input."""
        position = state["position"] if state else 0
        return {stream: [line for line in lines if _record_id(line) <= position] for stream, lines in self.per_stream.items()}


def _record_id(line: bytes) -> int:
    return json.loads(line)["record"]["id"]


def make_input(path: Path, records: int = RECORDS, state_every: int = STATE_EVERY) -> SingerInput:
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    lines = [schema_line(stream) for stream in STREAMS]
    data = SingerInput(lines, path, {stream: [] for stream in STREAMS})
    for i in range(1, records + 1):
        stream = "orders" if i % 3 == 0 else "users"
        at = start + timedelta(milliseconds=37 * i)
        stamp = at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
        record = {"id": i, "name": f"Zoë São {i}", "payload": f"{i:07d}" * 20, "at": stamp}
        message = {"type": "RECORD", "stream": stream, "record": record, "time_extracted": stamp}
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        lines.append(line)
        data.per_stream[stream].append(line)
        if i % state_every == 0:
            data.state_index[i] = len(lines)
            lines.append(json.dumps({"type": "STATE", "value": state_value(i)}).encode() + b"\n")
    path.write_bytes(b"".join(lines))
    return data


@pytest.fixture(scope="module")
def singer_input(tmp_path_factory) -> SingerInput:
    return make_input(tmp_path_factory.mktemp("input") / "input.singer.jsonl")


def write_config(directory: Path, name: str, **settings) -> Path:
    path = directory / f"{name}.json"
    path.write_text(json.dumps({**BASE_CONFIG, **settings}))
    return path


# -- processes -------------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, pgid, state) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[2]), fields[0]


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _stat(int(entry))
            if info:
                children.setdefault(info[0], []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen, known: list[int] | None = None) -> None:
    """SIGKILL the target and everything it started: a machine-crash for the writer.

    The target runs in its own session; Spark's Python daemon makes its own process group, so
    every group found among the descendants is killed too (workers it forks later join it).
    """
    pids = set(descendants(proc.pid)) | set(known or [])
    own = os.getpgrp()
    for _ in range(2):
        groups = {info[1] for pid in pids | {proc.pid} if (info := _stat(pid))}
        for group in groups - {own}:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in pids | {proc.pid}:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
    proc.wait(timeout=60)


def reap(pids: list[int], timeout: float = 30) -> None:
    """Wait for processes a finished target left behind to exit on their own; kill stragglers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if (info := _stat(pid)) and info[2] != "Z"]
        if not alive:
            return
        time.sleep(0.2)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class TargetRun:
    """``target-singerlake --config CONFIG`` with its stdout read line by line as it is written."""

    def __init__(self, config: Path, stdin, log: Path, env: dict | None = None):
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [TARGET, "--config", str(config)],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                env=env,
            )
        self.lines: list[bytes] = []
        self.partial = b""
        self.eof = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                if line.endswith(b"\n"):
                    self.lines.append(line)
                else:
                    self.partial = line  # cut by a kill: never a STATE the target emitted
                self._changed.notify_all()
        with self._changed:
            self.eof = True
            self._changed.notify_all()

    @property
    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def states(self) -> list[dict]:
        with self._changed:
            lines = list(self.lines)
        return [json.loads(line) for line in lines]

    def wait_for_states(self, count: int) -> None:
        with self._changed:
            done = self._changed.wait_for(lambda: len(self.lines) >= count or self.eof, HANG_S)
        assert done, f"no {count} STATE lines within {HANG_S}s (hang?); stderr:\n{self.stderr[-3000:]}"
        assert len(self.lines) >= count, f"target ended after {len(self.lines)} STATE lines; stderr:\n{self.stderr[-3000:]}"

    def finish_reading(self) -> None:
        self._reader.join(timeout=60)
        assert not self._reader.is_alive(), "stdout stayed open after the target died"

    def crash(self) -> None:
        kill_tree(self.proc)
        self.finish_reading()

    def wait(self) -> int:
        children = descendants(self.proc.pid)
        try:
            code = self.proc.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc)
            pytest.fail(f"target did not exit within {HANG_S}s (hang); stderr:\n{self.stderr[-3000:]}")
        self.finish_reading()
        reap(children)
        return code

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            kill_tree(self.proc)


def run_to_end(config: Path, lines: list[bytes], directory: Path, name: str, env: dict | None = None) -> TargetRun:
    source = directory / f"{name}.singer.jsonl"
    source.write_bytes(b"".join(lines))
    with open(source, "rb") as stdin:
        run = TargetRun(config, stdin, directory / f"{name}.stderr", env)
        try:
            code = run.wait()
        finally:
            run.cleanup()
    assert code == 0, f"{name}: exit {code}; stderr:\n{run.stderr[-5000:]}"
    return run


# -- reading the lake back -------------------------------------------------------------------------
@dataclass
class LakeView:
    records: dict[str, list[bytes]]  # per stream: stored RECORD lines, in commit order
    committed: dict[str, set[str]]  # per stream: data file keys in the manifest
    on_storage: dict[str, set[str]]  # per stream: every data file key on storage
    locks: list[str]

    @property
    def orphans(self) -> set[str]:
        return {key for stream in STREAMS for key in self.on_storage[stream] - self.committed[stream]}


def read_lake(lake: Lake, singer_input: SingerInput) -> LakeView:
    """Read the lake as a reader does, asserting nothing partial or corrupt is visible."""
    storage = lake.storage
    known = {line for lines in singer_input.per_stream.values() for line in lines}
    view = LakeView({}, {}, {}, [key for key in (info.key for info in storage.list("raw/")) if key.endswith("singerlake.lock")])
    for stream in STREAMS:
        paths = StreamPaths(TAP, stream)
        keys = {info.key for info in storage.list(f"{paths.stream_dir}/") if info.key.endswith(".singer.gz")}
        view.on_storage[stream] = keys
        # "No partial file under a data file's name" (SPEC §1): even uncommitted ones are whole.
        for key in keys:
            body = gzip.decompress(storage.read(key).data)
            assert body.endswith(b"\n"), f"{key} is cut short"
        if not storage.exists(paths.manifest):
            # The first manifest is written before the first data file (SPEC §7).
            assert not keys, f"data files of {stream!r} without a manifest: {sorted(keys)}"
            view.records[stream], view.committed[stream] = [], set()
            continue
        manifest = lake.manifest(TAP, stream)  # parses and validates
        commits = [entry["commit"] for entry in manifest.files]
        assert commits == sorted(commits) and len(set(entry["id"] for entry in manifest.files)) == len(commits)
        lines: list[bytes] = []
        for entry in manifest.files:
            assert entry["path"] in keys, f"manifest of {stream!r} lists a missing file {entry['path']}"
            data = storage.read(entry["path"]).data
            assert len(data) == entry["size"], entry["path"]
            assert hashlib.blake2b(data, digest_size=16).hexdigest() == entry["hash"], entry["path"]
            content = gzip.decompress(data).splitlines(keepends=True)
            first = json.loads(content[0])
            assert first["type"] == "SCHEMA" and first["stream"] == stream
            assert len(content) - 1 == entry["records"], entry["path"]
            for line in content[1:]:
                assert line in known and json.loads(line)["stream"] == stream, f"{entry['path']}: unexpected line {line[:80]!r}"
            lines.extend(content[1:])
        view.records[stream] = lines
        view.committed[stream] = {entry["path"] for entry in manifest.files}
    return view


def first_occurrences(lines: list[bytes]) -> list[bytes]:
    seen: set[bytes] = set()
    return [line for line in lines if not (line in seen or seen.add(line))]


def assert_covered(view: LakeView, singer_input: SingerInput, state: dict | None, *, duplicates: bool) -> None:
    """Every record before ``state`` is stored; stored records follow input order per stream."""
    covered = singer_input.covered_by(state)
    for stream in STREAMS:
        stored = view.records[stream]
        unique = first_occurrences(stored)
        if not duplicates:
            assert len(unique) == len(stored), f"{stream}: one run stored a record twice"
        expected = singer_input.per_stream[stream]
        assert unique == expected[: len(unique)], f"{stream}: stored records are not the input's order"
        assert len(unique) >= len(covered[stream]), (
            f"{stream}: {len(covered[stream])} records precede the last emitted STATE "
            f"{state and state['position']}, only {len(unique)} are in the lake"
        )


def assert_lake_complete(view: LakeView, singer_input: SingerInput) -> None:
    for stream in STREAMS:
        assert first_occurrences(view.records[stream]) == singer_input.per_stream[stream], f"{stream}: lake incomplete or out of order"


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
