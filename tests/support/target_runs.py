"""target-singerlake as a real process over a generated input (two interleaved streams, a STATE every
STATE_EVERY records), and the lake it leaves read back as a reader would: the tools of the crash and
cluster tests. Timeouts here only detect hangs; nothing asserts speed."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from singerlake import Lake
from singerlake.format.layout import StreamPaths

from support.processes import descendants, kill_tree, reap

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


def state_value(position: int, streams: tuple[str, ...] = STREAMS) -> dict:
    return {"bookmarks": {stream: {"id": position} for stream in streams}, "position": position}


@dataclass
class SingerInput:
    """Two interleaved streams, a STATE every STATE_EVERY records; the exact lines fed to the target."""

    lines: list[bytes]
    path: Path
    per_stream: dict[str, list[bytes]] = field(default_factory=dict)  # RECORD lines, in input order
    state_index: dict[int, int] = field(default_factory=dict)  # STATE position -> line index

    @property
    def streams(self) -> tuple[str, ...]:
        return tuple(self.per_stream)

    @property
    def states(self) -> list[dict]:
        return [state_value(position, self.streams) for position in sorted(self.state_index)]

    def resume_after(self, state: dict | None) -> list[bytes]:
        """What a resumed tap sends: its SCHEMA messages, then everything after that STATE."""
        if state is None:
            return self.lines
        start = self.state_index[state["position"]] + 1
        return [schema_line(stream) for stream in self.streams] + self.lines[start:]

    def covered_by(self, state: dict | None) -> dict[str, list[bytes]]:
        """Per stream, the records that came before ``state`` in the input."""
        position = state["position"] if state else 0
        return {stream: [line for line in lines if _record_id(line) <= position] for stream, lines in self.per_stream.items()}


def _record_id(line: bytes) -> int:
    return json.loads(line)["record"]["id"]


def two_streams(i: int) -> str:
    return "orders" if i % 3 == 0 else "users"


def make_input(path: Path, records: int = RECORDS, state_every: int = STATE_EVERY, streams=STREAMS, stream_of=two_streams) -> SingerInput:
    """``records`` records, record i in stream ``stream_of(i)`` (one of ``streams``), a STATE every ``state_every``."""
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    lines = [schema_line(stream) for stream in streams]
    data = SingerInput(lines, path, {stream: [] for stream in streams})
    for i in range(1, records + 1):
        stream = stream_of(i)
        at = start + timedelta(milliseconds=37 * i)
        stamp = at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
        record = {"id": i, "name": f"Zoë São {i}", "payload": f"{i:07d}" * 20, "at": stamp}
        message = {"type": "RECORD", "stream": stream, "record": record, "time_extracted": stamp}
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        lines.append(line)
        data.per_stream[stream].append(line)
        if i % state_every == 0:
            data.state_index[i] = len(lines)
            lines.append(json.dumps({"type": "STATE", "value": state_value(i, streams)}).encode() + b"\n")
    path.write_bytes(b"".join(lines))
    return data


def write_config(directory: Path, name: str, **settings) -> Path:
    path = directory / f"{name}.json"
    path.write_text(json.dumps({**BASE_CONFIG, **settings}))
    return path


# -- runs ------------------------------------------------------------------------------------------
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
        return {key for stream in self.on_storage for key in self.on_storage[stream] - self.committed[stream]}


def read_lake(lake: Lake, singer_input: SingerInput) -> LakeView:
    """Read the lake as a reader does, asserting nothing partial or corrupt is visible."""
    storage = lake.storage
    known = {line for lines in singer_input.per_stream.values() for line in lines}
    view = LakeView({}, {}, {}, [key for key in (info.key for info in storage.list("raw/")) if key.endswith("singerlake.lock")])
    for stream in singer_input.streams:
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
    for stream in singer_input.streams:
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
    for stream in singer_input.streams:
        assert first_occurrences(view.records[stream]) == singer_input.per_stream[stream], f"{stream}: lake incomplete or out of order"
