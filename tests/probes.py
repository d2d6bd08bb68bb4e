"""A process probe for cluster tests: a ``sitecustomize`` that logs each data file (``.singer.gz``)
a storage method touches, with the ancestry of the process that touched it (driver or executor)."""

from __future__ import annotations

from pathlib import Path

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
