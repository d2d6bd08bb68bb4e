"""Fetch pushed files back (SPEC.md §14): streamed, never held in memory, hash checked before the
file gets its name, so a damaged or partial copy never looks like the file.

Each file is written to a hidden temp file of a short fixed-length name beside its target (any name
the lake took fits), locked (flock) while it is written, then linked to its name: a file already
there is never replaced unless asked (``overwrite``), and is left alone when it holds the same
bytes. A fetch first removes the temp files of killed fetches in the directories it writes to: only
those nobody holds locked. A file that cannot be fetched is its own failure; the others are fetched.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import stat
import string
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from singerlake.errors import BadArgument, ConfigError, SingerlakeError, one_line
from singerlake.files import index
from singerlake.format.errors import CorruptFile
from singerlake.format.metadata import new_digest
from singerlake.storage import Storage
from singerlake.times import day_of

DEFAULT_NAME = "{id}-{name}"
CHUNK_BYTES = 1 << 20
TEMP_PREFIX = ".singerlake-fetch-"
TEMP_NAME = re.compile(re.escape(TEMP_PREFIX) + r"[0-9a-f]{16}\.part")
FETCHED, ALREADY_THERE, FAILED = "fetched", "already there", "failed"


def record_of(storage: Storage, file_id: str) -> dict:
    record = index.committed_record(storage, file_id)
    if record is None:
        raise ConfigError(f"{file_id}: no file with this id in {storage.url} (`singerlake files` lists them)")
    return record


def copy_verified(storage: Storage, record: dict, out: BinaryIO) -> int:
    """Stream the file into ``out``; raise CorruptFile after the last byte if its hash is not the record's."""
    digest = new_digest()
    size = 0
    with storage.open_read(record["key"]) as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    check_bytes(storage, record, digest.hexdigest(), size)
    return size


def check_bytes(storage: Storage, record: dict, hexdigest: str, size: int) -> None:
    """Raise CorruptFile unless a file's bytes, read whole, have its record's hash and size."""
    if hexdigest != record["hash"] or size != record["size"]:
        raise CorruptFile(f"{storage.url_of(record['key'])}: its bytes do not match the record's hash/size (file {record['id']})")


def name_fields(record: dict) -> dict:
    """What a name template may use (SPEC.md §14): the record's fields, and ``day``, its start's UTC day."""
    return {**record, "day": day_of(record["start"])}


def name_for(record: dict, template: str) -> Path:
    """A relative path from the record's fields; one that would leave the output directory is refused."""
    try:
        text = template.format_map(name_fields(record))
    except (KeyError, ValueError, IndexError) as exc:
        fields = "id, what, where, name, day, start_iso, ..."
        raise BadArgument("template", f"{template!r}: {exc} is not a field of the record ({fields})") from None
    parts = text.split("/")
    if text.startswith("/") or any(part in ("", ".", "..") for part in parts) or "\0" in text:
        raise BadArgument("template", f"{template!r} gives {text!r} for {record['id']}: not a path inside the output directory")
    return Path(*parts)


TELLING_APART = ("day", "start_iso", "where", "what", "name", "id")  # the fields a name may add, the most readable first


def telling_apart(template: str, one: dict, other: dict) -> str:
    """How to give two files that ``template`` names alike names of their own: a field it lacks that differs."""
    used = {field for _, field, _, _ in string.Formatter().parse(template) if field}
    one, other = name_fields(one), name_fields(other)
    field = next(f for f in TELLING_APART if f == "id" or (f not in used and one[f] != other[f]))
    head, _, last = template.rpartition("/")
    example = f"{head}/" * bool(head) + (f"{{{field}}}/" if field == "day" else f"{{{field}}}-") + last
    return f"add {{{field}}} to it, e.g. {example!r}" + (" (or {id}: one per file)" if field != "id" else "")


@dataclass(frozen=True)
class Fetched:
    """What became of one file: ``outcome`` FETCHED, ALREADY_THERE (the same bytes were at ``place``)
    or FAILED (``error`` says why, one line)."""

    record: dict
    place: str
    outcome: str
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.outcome == FAILED

    def to_dict(self) -> dict:
        doc = {"id": self.record["id"], "written_to": self.place, "outcome": self.outcome}
        return {**doc, "error": self.error} if self.failed else doc


def fetch(
    storage: Storage, records: list[dict], out: str | BinaryIO | None, template: str = DEFAULT_NAME, overwrite: bool = False
) -> list[Fetched]:
    """Write each file: one after another to a binary stream ``out`` (``-``: stdout), to ``out`` as a file
    (one record, not a directory), or into the directory ``out`` (default: here) under ``template``.
    What became of each, in order."""
    if out == "-" or not (out is None or isinstance(out, str)):
        stream = sys.stdout.buffer if out == "-" else out  # "-": stdout, as the Python API offers it (the CLI gives its own)
        for record in records:
            copy_verified(storage, record, stream)
        stream.flush()
        return [Fetched(record, "-", FETCHED) for record in records]
    records = list({record["id"]: record for record in records}.values())  # a file named twice is written once
    targets = _targets(records, out, template)
    for directory in sorted({target.parent for target in targets}):
        clean_leftovers(directory)
    with ThreadPoolExecutor(storage.parallel_requests) as pool:  # many files: requests in flight side by side
        return list(pool.map(lambda pair: fetch_to_path(storage, *pair, overwrite=overwrite), zip(records, targets, strict=True)))


def _targets(records: list[dict], out: str | None, template: str) -> list[Path]:
    """Where each file goes; two files to one name are refused before anything is written."""
    if out and len(records) == 1 and not Path(out).is_dir() and not out.endswith("/"):
        return [Path(out)]
    directory = Path(out or ".")
    targets = [directory / name_for(record, template) for record in records]
    named: dict[Path, dict] = {}
    for record, target in zip(records, targets, strict=True):
        first = named.setdefault(target, record)
        if first["id"] != record["id"]:
            hint = telling_apart(template, first, record)
            raise BadArgument("template", f"{template!r} gives {target} to both {first['id']} and {record['id']}: {hint}")
    return targets


def fetch_to_path(storage: Storage, record: dict, target: Path, overwrite: bool = False) -> Fetched:
    """One file to ``target``; its failure is its outcome, not an exception."""
    try:
        if _holds(target, record):
            return Fetched(record, str(target), ALREADY_THERE)
        if not overwrite and os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, "another file is there: not overwritten (--overwrite replaces it)")
        target.parent.mkdir(parents=True, exist_ok=True)
        with _locked_temp(target.parent) as (out, temp):
            copy_verified(storage, record, out)
            out.flush()
            _name(temp, target, overwrite)
    except OSError as exc:
        return Fetched(record, str(target), FAILED, _reason(exc))
    except SingerlakeError as exc:
        return Fetched(record, str(target), FAILED, one_line(exc))
    return Fetched(record, str(target), FETCHED)


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return f"{exc.strerror} for this file system: choose a shorter --name, e.g. '{{name}}' or '{{id}}'"
    return exc.strerror or one_line(exc)


def _holds(target: Path, record: dict) -> bool:
    """Whether ``target`` is a regular file of the record's size and hash (a FIFO there is never opened)."""
    try:
        info = os.stat(target)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_size != record["size"]:
        return False
    digest = new_digest()
    with os.fdopen(os.open(target, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest() == record["hash"]


def _name(temp: Path, target: Path, overwrite: bool) -> None:
    """Give the written file its name: a link fails if a file took the name meanwhile, unless ``overwrite``."""
    if overwrite:
        os.replace(temp, target)
        return
    try:
        os.link(temp, target)
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP) or os.path.lexists(target):
            raise
        os.replace(temp, target)  # a file system without hard links: the name was free a moment ago


@contextmanager
def _locked_temp(directory: Path) -> Iterator[tuple[BinaryIO, Path]]:
    """A new temp file in ``directory``, locked until it is closed; removed unless it was renamed."""
    fd, temp = _new_locked(directory)
    out = os.fdopen(fd, "wb")
    try:
        yield out, temp
    finally:
        try:
            temp.unlink(missing_ok=True)  # before unlocking: a cleaner never meets it unlocked
        finally:
            out.close()


def _new_locked(directory: Path) -> tuple[int, Path]:
    while True:
        temp = directory / f"{TEMP_PREFIX}{secrets.token_hex(8)}.part"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _same_file(fd, temp):
            return fd, temp
        os.close(fd)  # a cleaner removed it between its creation and the lock: take another


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.lstat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def clean_leftovers(directory: Path) -> None:
    """Remove the temp files that killed fetches left in ``directory``: those no running fetch holds locked."""
    try:
        names = [entry.name for entry in os.scandir(directory) if TEMP_NAME.fullmatch(entry.name)]
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        _remove_unlocked(directory / name)


def _remove_unlocked(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return  # gone, or not ours to open
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _same_file(fd, path):
            path.unlink()
    except OSError:
        pass  # locked: a fetch is writing it
    finally:
        os.close(fd)
