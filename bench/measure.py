"""Run a command with its input from a file, sampling wall time and the peak RSS of its whole process tree."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass

import psutil


@dataclass
class Measurement:
    wall_s: float
    peak_rss_mb: float
    returncode: int


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(
    cmd: list[str], stdin_path: str | None, env: dict | None = None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
) -> Measurement:
    """Wall time from start to exit; RSS summed over the process and all descendants, sampled every 50 ms."""
    peak = 0
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=stdin, stdout=stdout, stderr=stderr, env=env)
    watched = psutil.Process(proc.pid)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            try:
                peak = max(peak, tree_rss(watched))
            except psutil.Error:
                pass
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = proc.wait()
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    if stdin_path:
        stdin.close()
    return Measurement(wall, peak / 2**20, code)
