"""Processes a test started, and everything they started: found through /proc, killed as a machine crash would."""

from __future__ import annotations

import os
import signal
import subprocess
import time


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, pgid, state) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[2]), fields[0]


def process_state(pid: int) -> str | None:
    """A live process's state (R, S, T: stopped, Z...), or None."""
    info = _stat(pid)
    return info[2] if info else None


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
