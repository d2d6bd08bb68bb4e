"""Local filesystem backend: atomic writes by temp file + link/rename, CAS under a directory flock.

Durability (SPEC.md §9): a durable write fsyncs the file's bytes before its link or rename, then the
directory that holds the new name, then each directory above it not yet known durable up to the root
(a directory made by mkdir is itself an entry of its parent). ``sync(keys)`` does the same for objects
written without (``durable=False``), by this process or another one."""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import itertools
import os
import re
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from singerlake.storage.base import Blob, NotFound, ObjectInfo, PreconditionFailed, Storage, StorageError, check_key

_TMP_PREFIX = ".tmp-"
_TMP_TAG = uuid.uuid4().hex[:12]  # with the pid and a count: unique temp names without a uuid4 (a getrandom call) per write
_TMP_COUNT = itertools.count()
SYNCFS_FROM = 16  # keys: from more, sync() is one syncfs instead of their fsyncs, where that suffices
_NO_TMPFILE = {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT, errno.EACCES, errno.EPERM, errno.EXDEV}


def _tmp_name(name: str) -> str:
    return f"{_TMP_PREFIX}{name}.{_TMP_TAG}{os.getpid()}-{next(_TMP_COUNT)}"


@functools.cache
def _syncfs():
    """libc's syncfs (Linux), or None."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).syncfs  # the libc this process already has loaded
    except (OSError, AttributeError):
        return None


def _fsync(path: Path, missing_ok: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        if missing_ok:
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Filesystems whose syncfs(2) makes every write before it durable, data and names: the kernel's own on a local disk.
SYNCFS_DURABLE = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "jfs", "reiserfs", "nilfs2", "bcachefs", "zfs", "tmpfs"})


@functools.cache
def _syncfs_suffices(root: Path) -> bool:
    """Whether ``root`` is on a filesystem of ``SYNCFS_DURABLE`` (its mount found in /proc/self/mountinfo)."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    best, kind = "", ""
    for line in mounts:
        fields = line.split(" ")
        point = re.sub(r"\\([0-7]{3})", lambda escape: chr(int(escape[1], 8)), fields[4])  # a space is \040 there
        if (str(root) + "/").startswith(point.rstrip("/") + "/") and len(point) >= len(best):
            best, kind = point, fields[fields.index("-") + 1]
    return kind in SYNCFS_DURABLE


def _etag(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class LocalStorage(Storage):
    parallel_requests = 4  # local I/O is quick: more threads would only contend for the GIL

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser().absolute()
        self.url = str(self.root)
        self._tmpfile = hasattr(os, "O_TMPFILE")  # cleared on the first filesystem that refuses it
        self._durable_dirs: set[Path] = {self.root}  # directories whose own entry this process made durable (none is ever removed)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    @contextmanager
    def _guard(self, directory: Path):
        """Exclusive flock on the directory: serialises compare-and-swap; released if we die."""
        fd = os.open(directory, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def read(self, key: str) -> Blob:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            raise NotFound(f"{self.url_of(key)} does not exist") from None
        return Blob(data, _etag(data))

    def _write_temp(self, path: Path, data: bytes, durable: bool) -> Path:
        tmp = path.with_name(_tmp_name(path.name))
        try:
            handle = open(tmp, "wb")
        except FileNotFoundError:  # a new directory (the common case needs no mkdir calls)
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(tmp, "wb")
        with handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        return tmp

    def write(
        self,
        key: str,
        data: bytes,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
        durable: bool = True,
        content_type: str | None = None,
    ) -> str:
        path = self._path(key)
        if if_none_match and self._tmpfile and self._create_unnamed(key, path, data, durable):
            return _etag(data)
        try:
            tmp = self._write_temp(path, data, durable)
        except OSError as exc:
            raise StorageError(f"cannot write {self.url_of(key)}: {exc}") from exc
        try:
            if if_none_match:
                try:
                    os.link(tmp, path)  # atomic create-if-absent, never a partial file
                except FileExistsError:
                    raise PreconditionFailed(f"{self.url_of(key)} already exists") from None
            elif if_match is not None:
                with self._guard(path.parent):
                    current = self._current_etag(path)
                    if current != if_match:
                        raise PreconditionFailed(f"{self.url_of(key)} changed (expected etag {if_match})")
                    os.replace(tmp, path)
            else:
                os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        if durable:
            self._durable_name(path)
        return _etag(data)

    def _create_unnamed(self, key: str, path: Path, data: bytes, durable: bool) -> bool:
        """Create-only in two steps (Linux): the bytes into an unnamed file of the directory (O_TMPFILE),
        then linked under ``path`` whole or not at all; no temp name to remove, none left by a crash.
        False when the filesystem cannot (the caller falls back to a named temp file)."""
        try:
            try:
                fd = os.open(path.parent, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o666)
            except FileNotFoundError:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path.parent, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            if exc.errno in _NO_TMPFILE:
                self._tmpfile = False
                return False
            raise StorageError(f"cannot write {self.url_of(key)}: {exc}") from exc
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
            try:
                # linkat(AT_SYMLINK_FOLLOW), atomic create-if-absent: CPython calls linkat (not link, which
                # would link the /proc symlink itself) only when given a dir fd, here one the absolute path ignores
                os.link(f"/proc/self/fd/{fd}", path, src_dir_fd=fd)
            except FileExistsError:
                raise PreconditionFailed(f"{self.url_of(key)} already exists") from None
            except OSError as exc:
                if exc.errno not in _NO_TMPFILE:  # no /proc: the named temp file instead, from now on
                    raise StorageError(f"cannot write {self.url_of(key)}: {exc}") from exc
                self._tmpfile = False
                return False
        except OSError as exc:
            raise StorageError(f"cannot write {self.url_of(key)}: {exc}") from exc
        finally:
            os.close(fd)
        if durable:
            self._durable_name(path)
        return True

    def write_stream(self, key: str, chunks: Iterable[bytes], *, if_none_match: bool = False, content_type: str | None = None) -> None:
        path = self._path(key)
        tmp = path.with_name(_tmp_name(path.name))
        try:
            try:
                handle = open(tmp, "wb")
            except FileNotFoundError:
                path.parent.mkdir(parents=True, exist_ok=True)
                handle = open(tmp, "wb")
            with handle:
                for chunk in chunks:
                    handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            if if_none_match:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise PreconditionFailed(f"{self.url_of(key)} already exists") from None
            else:
                os.replace(tmp, path)
            self._durable_name(path)
        except OSError as exc:
            raise StorageError(f"cannot write {self.url_of(key)}: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)

    def sync(self, keys: Iterable[str]) -> None:
        """The objects at ``keys`` made durable with their names, whoever wrote them. For many keys, one
        syncfs(2) of the root's filesystem flushes them all: enough on a local disk's filesystem; on any
        other (FUSE passes no syncfs to its daemon, a network filesystem may keep the data on its
        client) and for a few keys, an fsync of each object and of its directories."""
        paths = [self._path(key) for key in keys]
        if len(paths) > SYNCFS_FROM and _syncfs_suffices(self.root):
            fd = os.open(self.root, os.O_RDONLY)
            try:
                syncfs = _syncfs()
                if syncfs is None or syncfs(fd) != 0:
                    os.sync()
            finally:
                os.close(fd)
            return
        try:
            with ThreadPoolExecutor(self.parallel_requests) as pool:  # a key gone meanwhile (a vacuum's delete) has nothing to keep
                list(pool.map(functools.partial(_fsync, missing_ok=True), paths))
                list(pool.map(functools.partial(_fsync, missing_ok=True), {path.parent for path in paths}))
            for path in paths:
                self._durable_parents(path.parent)
        except OSError as exc:
            raise StorageError(f"cannot sync {self.url}: {exc}") from exc

    def _durable_name(self, path: Path) -> None:
        """``path``'s name made durable: an fsync of its directory, and of the directories above it."""
        _fsync(path.parent)
        self._durable_parents(path.parent)

    def _durable_parents(self, directory: Path) -> None:
        """Each directory from ``directory`` up whose entry this process has not made durable yet: an fsync of its parent."""
        while directory not in self._durable_dirs and directory != directory.parent:
            _fsync(directory.parent)
            self._durable_dirs.add(directory)
            directory = directory.parent

    def _current_etag(self, path: Path) -> str | None:
        try:
            return _etag(path.read_bytes())
        except FileNotFoundError:
            return None

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        path = self._path(key)
        if if_match is None:
            path.unlink(missing_ok=True)
            return
        if not path.parent.exists():
            raise PreconditionFailed(f"{self.url_of(key)} does not exist")
        with self._guard(path.parent):
            if self._current_etag(path) != if_match:
                raise PreconditionFailed(f"{self.url_of(key)} changed (expected etag {if_match})")
            path.unlink()

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        base = self.root.joinpath(*prefix.split("/")[:-1]) if "/" in prefix else self.root
        found = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith("."):
                    continue
                full = Path(dirpath, name)
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix) and (start_after is None or key > start_after):
                    try:
                        stat = full.stat()
                    except FileNotFoundError:
                        continue
                    found.append(ObjectInfo(key, stat.st_size, stat.st_mtime))
        yield from sorted(found, key=lambda info: info.key)

    def leftovers(self, prefix: str) -> Iterator[ObjectInfo]:
        """Temp files of writes killed before their link/rename; delete them with ``delete(info.key)``."""
        base = self.root.joinpath(*prefix.split("/")[:-1]) if "/" in prefix else self.root
        for dirpath, _, filenames in os.walk(base):
            for name in filenames:
                if name.startswith(_TMP_PREFIX):
                    full = Path(dirpath, name)
                    try:
                        yield ObjectInfo(full.relative_to(self.root).as_posix(), full.stat().st_size, full.stat().st_mtime)
                    except FileNotFoundError:
                        continue

    def list_dirs(self, prefix: str) -> list[str]:
        base = self.root.joinpath(*[p for p in prefix.split("/") if p]) if prefix else self.root
        try:
            return sorted(e.name for e in os.scandir(base) if e.is_dir() and not e.name.startswith("."))
        except FileNotFoundError:
            return []

    def open_read(self, key: str) -> BinaryIO:
        try:
            return open(self._path(key), "rb")
        except FileNotFoundError:
            raise NotFound(f"{self.url_of(key)} does not exist") from None

    def root_exists(self) -> bool:
        return self.root.is_dir()

    def check_writable(self) -> None:
        try:
            made = [path for path in (self.root, *self.root.parents) if not path.exists()]
            self.root.mkdir(parents=True, exist_ok=True)
            for directory in made:  # a lake root made here is an entry of its parent: durable before anything in it
                _fsync(directory.parent)
            probe = self.root / f"{_TMP_PREFIX}write-check-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StorageError(f"lake root {self.url} is not writable: {exc}") from exc
