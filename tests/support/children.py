"""Running a test module's function in a separate OS process (real concurrency, real SIGKILL)."""

from __future__ import annotations

import json
import subprocess
import sys

from singerlake.storage import open_storage

# The child loads the test file by path and calls one of its module-level functions.
_BOOT = (
    "import importlib.util, json, os, sys\n"
    "sys.path.insert(0, os.path.dirname(sys.argv[1]))\n"
    "spec = importlib.util.spec_from_file_location('_test_child', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "getattr(module, sys.argv[2])(*json.loads(sys.argv[3]))\n"
)


def spawn(module_file: str, function: str, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _BOOT, module_file, function, json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def open_spec(spec: dict):
    """Open a lake root given as plain data {"url", "options"} (what child processes receive)."""
    return open_storage(spec["url"], **spec["options"])


def run_together(children: list[subprocess.Popen], timeout: float) -> None:
    """Wait until every child says "ready", release them at the same moment, and wait for all.

    Children still running afterwards (after a failure) are killed. The timeout only detects hangs.
    """
    try:
        for child in children:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            _, err = child.communicate(timeout=timeout)
            assert child.returncode == 0, err
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
