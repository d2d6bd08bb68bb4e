"""Hostile input to push and the files table (SPEC.md §14): what is not a regular file, files whose
size lies, names with terminal escapes, and pushes of the same files at once.

The real CLI in a subprocess, as test_files runs it; a command that would hang is stopped after
HANG_SECONDS and fails its test (a hang detector, not a time limit: each takes a few seconds).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import BACKENDS
from singerlake.cli.output import as_table
from test_files import BASE, Root, assert_refused, cli_env, cli_s3_args, root_on

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
@pytest.mark.parametrize("kind", ["local", pytest.param("moto", marks=pytest.mark.heavy)])
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
        assert lines[-1] == f"{len(pushed)} file(s) pushed, {len(already)} already in the lake"
        pushed_ids += pushed
    stored = {r["id"] for r in root.lake.find_files("docs", start=0, end="now")}
    assert len(stored) == count
    assert sorted(pushed_ids) == sorted(stored), f"{len(pushed_ids)} 'pushed' lines between them for {count} files stored"
