"""Hostile input to push, fetch and the files table (SPEC.md §14): what is not a regular file, files
whose size lies, names of 250 bytes or with terminal escapes, a fetch onto a file already there, a
fetch killed halfway, one bad file among good ones, and pushes of the same files at once.

The real CLI in a subprocess, as test_files runs it; a command that would hang is stopped after
HANG_SECONDS and fails its test (a hang detector, not a time limit: each takes a few seconds).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from singerlake.cli.output import as_table
from singerlake.files.errors import FetchFailed
from support.files_roots import BASE, Root, assert_refused, cli_env, cli_s3_args, root_on
from support.s3_servers import BACKENDS

HANG_SECONDS = 60


def run(root: Root, command: str, *args: str) -> subprocess.CompletedProcess:
    """``singerlake COMMAND ROOT ARGS`` as ``Root.cli`` runs it, failing the test if it hangs."""
    argv = root.command(command, *(cli_s3_args(root) if root.options else []), *args)
    try:
        return subprocess.run(argv, capture_output=True, env=cli_env(root), timeout=HANG_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"singerlake {command} {' '.join(args)} still runs after {HANG_SECONDS} s: it hangs")


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stderr.decode()
    return result


def failed_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.decode().splitlines() if ": failed: " in line]


def hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# -- push: anything but a regular file, files whose size lies ---------------------------------------
def fifo(directory: Path) -> Path:
    os.mkfifo(directory / "pipe")
    return directory / "pipe"


def socket_file(directory: Path) -> Path:
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(directory / "listener.sock"))  # the socket file stays once it is closed
    return directory / "listener.sock"


HOSTILE = {
    # case: (the file made in a directory, or a path of the system; pushed alone or in a folder; what the line says)
    "FIFO": (fifo, False, "a FIFO (named pipe), not a regular file"),
    "FIFO in a folder": (fifo, True, "a FIFO (named pipe), not a regular file"),
    "socket in a folder": (socket_file, True, "a socket, not a regular file"),
    "/dev/zero": ("/dev/zero", False, "a character device, not a regular file"),
    "/proc/self/status": ("/proc/self/status", False, "its size (0 bytes) is not what it holds"),
    "/proc/self/mem": ("/proc/self/mem", False, "cannot read it: Input/output error"),
}


@pytest.mark.parametrize(
    "kind, case",
    [
        pytest.param(kind, case, id=f"{kind}-{case}")
        for kind in BACKENDS
        for case in HOSTILE
        if kind == "local" or case == "FIFO in a folder"  # on S3 only "nothing stored" differs
    ],
)
def test_push_refuses_what_is_not_a_regular_file_of_a_true_size(request, tmp_path, kind, case):
    root = root_on(request, kind, tmp_path)
    make, in_folder, says = HOSTILE[case]
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "good.txt").write_bytes(b"a good file beside it")
    bad = Path(make) if isinstance(make, str) else make(folder)
    result = run(root, "push", str(folder if in_folder else bad), "--what", "logs", "--where", "web")
    assert_refused(root, result, str(bad))  # exit 2, one line naming it, nothing under files/, the good file neither
    err = result.stderr.decode()
    assert says in err and "changed while it was pushed" not in err and "Traceback" not in err, err


# -- fetch: names of 250 bytes, a file already there, one failure among good files -------------------
def push_files(root: Root, folder: Path, files: dict[str, bytes]) -> dict[str, dict]:
    """Push ``files`` (name -> bytes) from ``folder``; their records by name."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    pushed = json.loads(ok(run(root, "push", str(folder), "--what", "docs", "--where", "web", "--start", str(BASE), "--json")).stdout)
    return {record["name"]: record for record in pushed["pushed"]}


LONG_NAME = "n" * 246 + ".txt"  # 250 bytes: any file system takes it, the default "{id}-{name}" is too long


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_file_of_a_250_byte_name_is_fetched_and_the_batch_goes_on(request, tmp_path, kind):
    root = root_on(request, kind, tmp_path)
    records = push_files(root, tmp_path / "src", {LONG_NAME: b"long name", "short.txt": b"short name"})
    ids = [records[LONG_NAME]["id"], records["short.txt"]["id"]]
    out = tmp_path / "out"
    ok(run(root, "fetch", *ids, "--out", str(out), "--name", "{name}"))
    assert (out / LONG_NAME).read_bytes() == b"long name" and (out / "short.txt").read_bytes() == b"short name"
    assert hidden(out) == [], "no temp file left"

    result = run(root, "fetch", *ids, "--out", str(tmp_path / "default"))  # {id}-{name}: 283 bytes, too long for a name
    target = tmp_path / "default" / f"{ids[0]}-{LONG_NAME}"
    lines = failed_lines(result)
    assert result.returncode == 1 and len(lines) == 1 and "Traceback" not in result.stderr.decode(), result.stderr.decode()
    assert lines[0].startswith(f"singerlake fetch: failed: {ids[0]} -> {target}: ") and "too long" in lines[0]
    assert (tmp_path / "default" / f"{ids[1]}-short.txt").read_bytes() == b"short name", "the rest of the batch is fetched"


def test_fetch_never_overwrites_a_file_unless_asked(tmp_path):
    root = Root("local", str(tmp_path / "lake"))
    record = push_files(root, tmp_path / "src", {"a.txt": b"the pushed bytes"})["a.txt"]
    mine = tmp_path / "out" / "a.txt"
    mine.parent.mkdir()
    mine.write_bytes(b"my own file")

    result = run(root, "fetch", record["id"], "--out", str(mine))
    assert result.returncode == 1 and failed_lines(result) == [
        f"singerlake fetch: failed: {record['id']} -> {mine}: another file is there: not overwritten (--overwrite replaces it)"
    ], result.stderr.decode()
    found = run(root, "files", "--what", "docs", "--start", str(BASE), "--fetch", str(mine.parent), "--name", "{name}")
    assert found.returncode == 1 and len(failed_lines(found)) == 1 and str(mine) in failed_lines(found)[0]
    with pytest.raises(FetchFailed, match="not overwritten"):
        root.lake.fetch(record["id"], str(mine))
    assert mine.read_bytes() == b"my own file" and hidden(mine.parent) == [], "untouched, nothing left beside it"

    ok(run(root, "files", "--what", "docs", "--start", str(BASE), "--fetch", str(mine.parent), "--name", "{name}", "--overwrite"))
    assert mine.read_bytes() == b"the pushed bytes"
    inode = mine.stat().st_ino
    again = ok(run(root, "fetch", record["id"], "--out", str(mine)))  # the same bytes there: left as they are
    assert again.stdout.decode() == f"{record['id']} -> {mine} (already there)\n" and mine.stat().st_ino == inode
    mine.write_bytes(b"changed again")
    ok(run(root, "fetch", record["id"], "--out", str(mine), "--overwrite"))
    assert mine.read_bytes() == b"the pushed bytes"
    mine.write_bytes(b"and again")
    assert [o.outcome for o in root.lake.fetch(record["id"], str(mine), overwrite=True)] == ["fetched"]
    assert mine.read_bytes() == b"the pushed bytes"


@pytest.mark.parametrize("kind", BACKENDS)
def test_files_that_fail_are_one_line_each_and_the_others_are_fetched(request, tmp_path, kind):
    root = root_on(request, kind, tmp_path)
    files = {name: f"bytes of {name}".encode() for name in ("good1.txt", "damaged.txt", "taken.txt", "good2.txt")}
    records = push_files(root, tmp_path / "src", files)
    root.storage.write(records["damaged.txt"]["key"], b"not the bytes pushed")
    out = tmp_path / "out"
    out.mkdir()
    (out / "taken.txt").write_bytes(b"a file of mine")
    ids = [records[name]["id"] for name in files]

    result = run(root, "fetch", *ids, "--out", str(out), "--name", "{name}", "--json")
    lines = failed_lines(result)
    assert result.returncode == 1 and len(lines) == 2, result.stderr.decode()
    for name, why in (("damaged.txt", "do not match the record"), ("taken.txt", "another file is there")):
        named = f"singerlake fetch: failed: {records[name]['id']} -> {out / name}: "
        assert [line for line in lines if line.startswith(named) and why in line], (name, lines)
    outcomes = {o["id"]: o["outcome"] for o in json.loads(result.stdout)}
    assert outcomes == {ids[0]: "fetched", ids[1]: "failed", ids[2]: "failed", ids[3]: "fetched"}
    assert (out / "good1.txt").read_bytes() == files["good1.txt"] and (out / "good2.txt").read_bytes() == files["good2.txt"]
    assert not (out / "damaged.txt").exists() and (out / "taken.txt").read_bytes() == b"a file of mine"
    assert hidden(out) == []


# -- a fetch killed halfway leaves a temp file: the next fetch removes it, never a running one's ------
STALLED_FETCH = (
    "import sys\n"
    "import singerlake.files.fetch as fetch\n"
    "def stalled(storage, record, out):\n"
    "    out.write(b'half a file')\n"
    "    out.flush()\n"
    "    print('writing', flush=True)\n"
    "    sys.stdin.read()  # until the test kills it\n"
    "fetch.copy_verified = stalled\n"
    "from singerlake.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_the_next_fetch_removes_what_a_killed_one_left_and_never_a_running_ones_file(tmp_path):
    root = Root("local", str(tmp_path / "lake"))
    records = push_files(root, tmp_path / "src", {"big.bin": os.urandom(1 << 20), "small.txt": b"small"})
    out = tmp_path / "out"
    out.mkdir()
    argv = [sys.executable, "-c", STALLED_FETCH, "fetch", root.url, records["big.bin"]["id"], "--out", str(out)]
    stalled = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(root))
    try:
        assert stalled.stdout.readline() == b"writing\n", stalled.stderr.read().decode()
        running = hidden(out)
        assert len(running) == 1, "the stalled fetch writes a hidden temp file"
        ok(run(root, "fetch", records["small.txt"]["id"], "--out", str(out)))
        assert hidden(out) == running, "a fetch into the same folder leaves a running fetch's temp file alone"
    finally:
        stalled.send_signal(signal.SIGKILL)
        stalled.wait()
    assert hidden(out) == running, "killed: its temp file is left"
    ok(run(root, "fetch", records["small.txt"]["id"], "--out", str(out)))
    assert hidden(out) == [], "the next fetch into that folder removed it"
    ok(run(root, "fetch", records["big.bin"]["id"], "--out", str(out)))
    assert (out / f"{records['big.bin']['id']}-big.bin").read_bytes() == (tmp_path / "src" / "big.bin").read_bytes()


# -- names that would rewrite the screen ------------------------------------------------------------
EVIL = "a\rb\x1b[2Jc\td\\e\x7f"
SHOWN = "a\\rb\\033[2Jc\\td\\\\e\\177"  # as ls -b shows it


def test_control_characters_in_names_are_escaped_in_text_and_exact_in_json(tmp_path):
    root = Root("local", str(tmp_path / "lake"))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / EVIL).write_bytes(b"evil")
    pushed = ok(run(root, "push", str(tmp_path / "src"), "--what", "docs", "--where", "web", "--start", str(BASE))).stdout.decode()
    table = ok(run(root, "files", "--what", "docs", "--start", str(BASE))).stdout.decode()
    record = json.loads(ok(run(root, "files", "--what", "docs", "--start", str(BASE), "--json")).stdout)[0]
    fetched = ok(run(root, "fetch", record["id"], "--out", f"{tmp_path / 'out'}/", "--name", "{name}")).stdout.decode()
    assert record["name"] == EVIL, "JSON keeps the name exact"
    assert (tmp_path / "out" / EVIL).read_bytes() == b"evil"
    for text, line in ((pushed, f"pushed {record['id']} {tmp_path / 'src'}/{SHOWN} (4 bytes)"),
                       (table, f"| {SHOWN}"), (fetched, f"{record['id']} -> {tmp_path / 'out'}/{SHOWN}")):  # fmt: skip
        assert line in text and not {"\r", "\x1b", "\t", "\x7f"} & set(text), text
    assert as_table(["v\x1b"], [("\x9b2J\u202e",), ("x\\n",)]).splitlines()[2:4] == ["\\302\\2332J\\342\\200\\256", "x\\\\n"]


# -- pushes of the same files at once: each file reported pushed once between them ------------------
@pytest.mark.parametrize("kind", ["local"])  # the rule is create-only writes, proven on every backend by test_storage
def test_pushes_of_the_same_files_at_once_report_each_file_pushed_once(request, tmp_path, kind):
    root = root_on(request, kind, tmp_path)
    count, pushers = 200, 4
    (tmp_path / "src").mkdir()
    for n in range(count):
        (tmp_path / "src" / f"f{n:03d}.txt").write_bytes(f"file {n}\n".encode())
    argv = root.command("push", *(cli_s3_args(root) if root.options else []), str(tmp_path / "src"), "--what", "docs", "--where", "web")
    processes = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(root)) for _ in range(pushers)]
    try:
        outputs = [process.communicate(timeout=HANG_SECONDS * 4)[0].decode().splitlines() for process in processes]
    except subprocess.TimeoutExpired:
        pytest.fail(f"{pushers} pushes at once still run after {HANG_SECONDS * 4} s: they hang")
    assert [p.returncode for p in processes] == [0] * pushers
    pushed_ids = []
    for lines in outputs:
        pushed = [line.split()[1] for line in lines if line.startswith("pushed ")]
        already = [line.split()[5].rstrip(":") for line in lines if line.startswith("already in the lake as ")]
        assert sorted(pushed + already) == sorted(set(pushed + already)) and len(pushed + already) == count, "each file once"
        assert lines[-1] == f"{len(pushed)} file{'s' * (len(pushed) != 1)} pushed, {len(already)} already in the lake"
        pushed_ids += pushed
    stored = {r["id"] for r in root.lake.find_files("docs", start=0, end="now")}
    assert len(stored) == count
    assert sorted(pushed_ids) == sorted(stored), f"{len(pushed_ids)} 'pushed' lines between them for {count} files stored"
