"""A process probe for cluster tests: a ``sitecustomize`` that logs each data file (``.singer.gz``)
a storage method touches, with the ancestry of the process that touched it (driver or executor);
``probed_env`` gives a run that probe, ``writers`` reads its log and ``nearest_jvm`` tells a writer's JVM."""

from __future__ import annotations

import json
import os
from pathlib import Path

CLUSTER = "local-cluster[2,1,1024]"  # executors as processes of their own, under executor JVMs

_PROBE = '''
"""Test probe: log which process calls __METHODS__ on each data file (only when __ENV__ is set)."""
import json
import os

LOG = os.environ.get("__ENV__")


def _ancestry(pid):
    chain = []
    while pid > 1 and len(chain) < 32:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\\0", b" ").decode("utf-8", "replace").strip()
            with open(f"/proc/{pid}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        chain.append({"pid": pid, "cmdline": cmdline})
        pid = parent
    return chain


def _log(key):
    line = json.dumps({"key": key, "pid": os.getpid(), "ancestry": _ancestry(os.getpid())}) + "\\n"
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def _install():
    from singerlake.storage import LocalStorage, S3Storage

    for cls in (LocalStorage, S3Storage):
        for name in __METHODS__:
            original = getattr(cls, name)

            def wrapped(self, key, *args, _original=original, **kwargs):
                result = _original(self, key, *args, **kwargs)
                if key.endswith(".singer.gz"):
                    _log(key)
                return result

            setattr(cls, name, wrapped)


if LOG:
    _install()
'''


def write_probe(directory: Path, env: str, methods: tuple[str, ...]) -> Path:
    """``directory`` made to hold the probe's ``sitecustomize.py`` (put it first on PYTHONPATH)."""
    directory.mkdir(exist_ok=True)
    (directory / "sitecustomize.py").write_text(_PROBE.replace("__ENV__", env).replace("__METHODS__", repr(methods)))
    return directory


def probed_env(tmp_path: Path) -> tuple[dict, Path]:
    """The environment of a run whose processes log each data file they write, and that log."""
    probe = write_probe(tmp_path / "probe", "SINGERLAKE_TEST_WRITE_LOG", ("write",))
    log = tmp_path / "writes.jsonl"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(probe), env.get("PYTHONPATH")]))
    env["SINGERLAKE_TEST_WRITE_LOG"] = str(log)
    return env, log


def writers(log: Path) -> dict[str, dict]:
    """Data file key (relative to the lake root) -> the process that wrote it."""
    found = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        found[entry["key"]] = entry
    return found


def nearest_jvm(entry: dict) -> dict:
    """The closest ancestor of the writing process that is a Java process."""
    for process in entry["ancestry"][1:]:
        if process["cmdline"].split(" ", 1)[0].endswith("/java"):
            return process
    raise AssertionError(f"{entry['key']} was written by pid {entry['pid']}, which has no JVM ancestor: {entry['ancestry']}")
