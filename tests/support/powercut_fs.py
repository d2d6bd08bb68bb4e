"""A FUSE file system for tests that models a power cut: what a disk would still hold if the power went at any instant.

Every operation changes the *current* state, kept in memory. Beside it the file system keeps the *durable* state,
and a test can ask at any moment for a **snapshot**: the durable state written out as a real directory tree, exactly
what the machine would find after a power cut at that instant. The file system keeps running after a snapshot.

The model:
- Nodes (files and directories) are objects with their own identity; inode numbers are never reused. A file has
  ``data`` (current) and ``durable`` (its bytes as of its last fsync or fdatasync; None when never synced). A
  directory has ``entries`` (current names) and ``durable_entries`` (its names as of its last fsync of the directory).
- A snapshot walks from the root's ``durable_entries``: a file entry gets the node's ``durable`` bytes (empty when
  never synced); a directory entry is created and filled from ITS ``durable_entries`` (a directory whose entry is
  durable but which was never fsynced itself is empty). So unsynced data is lost; a synced file whose directory was
  not synced is absent; a rename not made durable leaves the old name (with the node's durable data); an unlink not
  made durable brings the file back; a new directory needs its parent fsynced; hard links are two entries naming one
  node (written as hard links in the snapshot).
- Each directory is durable on its own, harsher than a journaling file system: a rename across two directories may
  survive in neither, in one (the node vanishes, or has two names) or in both. Such states can even nest a directory
  in itself; a snapshot leaves out the entry that would close the loop.
- Metadata (mode, times, a size set by truncate) is current only: truncate changes current data, like a write.
- The kernel never forwards syncfs(2) or sync(2) to a FUSE daemon (only virtiofs gets FUSE_SYNCFS): they make
  nothing durable here. O_TMPFILE is not in libfuse's high-level API: the kernel answers EOPNOTSUPP. Symbolic links,
  device nodes and extended attributes are not supported either.
- renameat2's RENAME_NOREPLACE and RENAME_EXCHANGE are honoured (mfusepy drops the flags: ``_Fuse`` passes them on).
- At mount, the tree under ``--image DIR`` is loaded into memory, all of it durable.
- One lock covers every operation and the snapshot's walk, so a snapshot is atomic with respect to file operations.

Run as ``python powercut_fs.py MOUNTPOINT --image DIR --control SOCKET``: mounts in the foreground and answers line
commands on the Unix socket: ``ping`` -> ``ok``; ``settle`` (everything durable) -> ``ok``;
``snapshot PATH`` (PATH must not exist) -> ``ok <files> <bytes>``
or ``error <why>``. Tests use ``PowerCutFS.start(...)``, and skip with ``why_unavailable()`` when it is not None.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import itertools
import os
import shutil
import socket
import socketserver
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    import mfusepy
except Exception as error:  # ImportError, or OSError/AttributeError when libfuse3 is missing or too old
    mfusepy, _IMPORT_ERROR = None, f"{type(error).__name__}: {error}"

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2  # linux/fs.h: the os module does not export them
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2  # libfuse passes these with tv_sec 0
_inodes = itertools.count(1)


@dataclass(eq=False)
class File:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes | None = None
    mode: int = 0o644
    nlink: int = 1
    mtime_ns: int = field(default_factory=time.time_ns)
    ino: int = field(default_factory=lambda: next(_inodes))


@dataclass(eq=False)
class Dir:
    entries: dict[str, File | Dir] = field(default_factory=dict)
    durable_entries: dict[str, File | Dir] = field(default_factory=dict)  # replaced by fsyncdir, never changed in place
    mode: int = 0o755
    mtime_ns: int = field(default_factory=time.time_ns)
    ino: int = field(default_factory=lambda: next(_inodes))


def _load(image: Path, seen: dict[tuple[int, int], File]) -> Dir:
    """The image's tree as nodes, all durable; hard links inside the image stay one node."""
    directory = Dir(mode=stat.S_IMODE(image.stat().st_mode))
    for entry in os.scandir(image):
        info = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            node = _load(Path(entry.path), seen)
        elif stat.S_ISREG(info.st_mode):
            node = seen.get((info.st_dev, info.st_ino))
            if node is None:
                data = Path(entry.path).read_bytes()
                node = seen[info.st_dev, info.st_ino] = File(bytearray(data), data, stat.S_IMODE(info.st_mode), nlink=0)
            node.nlink += 1
        else:
            raise ValueError(f"{entry.path}: only files and directories can be loaded")
        directory.entries[entry.name] = node
    directory.durable_entries = dict(directory.entries)
    return directory


def _durable_tree(directory: Dir, at: Path, out: list, ancestors: frozenset) -> None:
    for name, node in directory.durable_entries.items():
        if isinstance(node, File):
            out.append((at / name, node, node.durable or b""))
        elif node not in ancestors:
            out.append((at / name, None, None))
            _durable_tree(node, at / name, out, ancestors | {node})


def _fail(code: int) -> OSError:
    return mfusepy.FuseOSError(code)


def _locked(method):
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self.mutex:
            return method(self, *args, **kwargs)

    return locked


class PowerCutOps:
    """The operations mfusepy calls. A plain class: mfusepy wires every attribute named like a FUSE operation, so no
    other attribute may be named so (hence ``mutex``, not ``lock``)."""

    use_ns = True

    def __init__(self, root: Dir) -> None:
        self.mutex = threading.Lock()
        self.root = root
        self.handles: dict[int, File | Dir] = {}  # an open file keeps its node through renames and unlinks
        self.next_handle = itertools.count(1)

    def snapshot(self, target: Path) -> tuple[int, int]:
        target.mkdir(parents=True)
        plan: list = []
        with self.mutex:  # durable bytes and dicts are only ever replaced, so the writing needs no lock
            _durable_tree(self.root, target, plan, frozenset([self.root]))
        written: dict[File, Path] = {}
        size = 0
        for path, node, data in plan:
            if node is None:
                path.mkdir()
            elif node in written:
                os.link(written[node], path)
            else:
                path.write_bytes(data)
                written[node], size = path, size + len(data)
        return sum(node is not None for _, node, _ in plan), size

    @_locked
    def settle(self) -> None:
        """Everything reachable made durable, as the kernel's writeback would in time (or an orderly shutdown)."""
        pending, seen = [self.root], {self.root}
        while pending:
            directory = pending.pop()
            directory.durable_entries = dict(directory.entries)
            for node in directory.entries.values():
                if isinstance(node, File):
                    node.durable = bytes(node.data)
                elif node not in seen:
                    seen.add(node)
                    pending.append(node)

    def _node(self, path: str | None, fh: int | None = None) -> File | Dir:
        if fh in self.handles:
            return self.handles[fh]
        if path is None:
            raise _fail(errno.ENOENT)
        node = self.root
        for name in filter(None, path.split("/")):
            if not isinstance(node, Dir):
                raise _fail(errno.ENOTDIR)
            if name not in node.entries:
                raise _fail(errno.ENOENT)
            node = node.entries[name]
        return node

    def _file(self, path: str | None, fh: int | None = None) -> File:
        node = self._node(path, fh)
        if isinstance(node, Dir):
            raise _fail(errno.EISDIR)
        return node

    def _parent(self, path: str) -> tuple[Dir, str]:
        head, _, name = path.rpartition("/")
        parent = self._node(head or "/")
        if not isinstance(parent, Dir):
            raise _fail(errno.ENOTDIR)
        return parent, name

    def _open(self, node: File | Dir, flags: int = 0) -> int:
        if flags & os.O_TRUNC and isinstance(node, File):
            node.data.clear()
        handle = next(self.next_handle)
        self.handles[handle] = node
        return handle

    @_locked
    def getattr(self, path, fh=None):
        node = self._node(path, fh)
        kind, size, nlink = (stat.S_IFDIR, 0, 2) if isinstance(node, Dir) else (stat.S_IFREG, len(node.data), node.nlink)
        times = dict.fromkeys(("st_atime", "st_mtime", "st_ctime"), node.mtime_ns)
        return {"st_mode": kind | node.mode, "st_ino": node.ino, "st_nlink": nlink, "st_size": size, "st_blocks": -(-size // 512), **times}

    @_locked
    def readdir(self, path, fh):
        # glibc skips entries whose d_ino is 0, and with use_ino libfuse passes ours on
        return [
            (name, {"st_ino": node.ino, "st_mode": stat.S_IFDIR if isinstance(node, Dir) else stat.S_IFREG}, 0)
            for name, node in self._node(path, fh).entries.items()
        ]

    @_locked
    def open(self, path, flags):
        return self._open(self._file(path), flags)

    @_locked
    def opendir(self, path):
        return self._open(self._node(path))

    @_locked
    def release(self, path, fh):
        self.handles.pop(fh, None)

    releasedir = release

    @_locked
    def create(self, path, mode, flags):
        parent, name = self._parent(path)
        if name not in parent.entries:
            parent.entries[name] = File(mode=stat.S_IMODE(mode))
        return self._open(self._file(path), flags)

    @_locked
    def read(self, path, size, offset, fh):
        return bytes(self._file(path, fh).data[offset : offset + size])

    @_locked
    def write(self, path, data, offset, fh):
        node = self._file(path, fh)
        if offset > len(node.data):
            node.data = node.data.ljust(offset, b"\0")
        node.data[offset : offset + len(data)] = data
        node.mtime_ns = time.time_ns()
        return len(data)

    @_locked
    def truncate(self, path, length, fh=None):
        node = self._file(path, fh)
        node.data, node.mtime_ns = node.data[:length].ljust(length, b"\0"), time.time_ns()

    @_locked
    def fsync(self, path, datasync, fh):
        node = self._file(path, fh)
        node.durable = bytes(node.data)

    @_locked
    def fsyncdir(self, path, datasync, fh):
        node = self._node(path, fh)
        node.durable_entries = dict(node.entries)

    @_locked
    def mkdir(self, path, mode):
        parent, name = self._parent(path)
        if name in parent.entries:
            raise _fail(errno.EEXIST)
        parent.entries[name] = Dir(mode=stat.S_IMODE(mode))

    @_locked
    def rmdir(self, path):
        parent, name = self._parent(path)
        node = self._node(path)
        if not isinstance(node, Dir):
            raise _fail(errno.ENOTDIR)
        if node.entries:
            raise _fail(errno.ENOTEMPTY)
        del parent.entries[name]

    @_locked
    def unlink(self, path):
        parent, name = self._parent(path)
        self._file(path).nlink -= 1
        del parent.entries[name]

    @_locked
    def link(self, target, source):  # mfusepy's order: target is the new name
        node = self._file(source)
        parent, name = self._parent(target)
        if name in parent.entries:
            raise _fail(errno.EEXIST)
        parent.entries[name] = node
        node.nlink += 1

    @_locked
    def rename(self, old, new, flags=0):
        if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE):
            raise _fail(errno.EINVAL)
        (old_parent, old_name), (new_parent, new_name) = self._parent(old), self._parent(new)
        node, existing = self._node(old), new_parent.entries.get(new_name)
        if flags & RENAME_EXCHANGE:
            if existing is None:
                raise _fail(errno.ENOENT)
            old_parent.entries[old_name], new_parent.entries[new_name] = existing, node
            return
        if existing is not None and flags & RENAME_NOREPLACE:
            raise _fail(errno.EEXIST)
        if existing is node:  # two names of one file: POSIX says do nothing
            return
        if isinstance(existing, Dir):
            if not isinstance(node, Dir):
                raise _fail(errno.EISDIR)
            if existing.entries:
                raise _fail(errno.ENOTEMPTY)
        elif existing is not None:
            if isinstance(node, Dir):
                raise _fail(errno.ENOTDIR)
            existing.nlink -= 1
        del old_parent.entries[old_name]
        new_parent.entries[new_name] = node

    @_locked
    def chmod(self, path, mode):
        self._node(path).mode = stat.S_IMODE(mode)

    def chown(self, path, uid, gid):
        return 0

    @_locked
    def utimens(self, path, times=None):
        mtime = times[1] if times else UTIME_NOW
        if mtime != UTIME_OMIT:
            self._node(path).mtime_ns = time.time_ns() if mtime == UTIME_NOW else mtime

    def statfs(self, path):
        free = 1 << 24  # blocks and inodes: plenty, as far as a program asking is concerned
        return {
            "f_bsize": 4096,
            "f_frsize": 4096,
            "f_namemax": 255,
            **dict.fromkeys(("f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree"), free),
        }


class _Control(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for line in self.rfile:
            command, _, argument = line.decode().strip().partition(" ")
            try:
                if command == "ping":
                    reply = "ok"
                elif command == "settle":
                    self.server.ops.settle()
                    reply = "ok"
                elif command == "snapshot" and argument:
                    reply = "ok {} {}".format(*self.server.ops.snapshot(Path(argument)))
                else:
                    reply = f"error unknown command: {line.decode().strip()}"
            except Exception as error:
                reply = " ".join(f"error {type(error).__name__}: {error}".split())
            self.wfile.write(f"{reply}\n".encode())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--image", type=Path, required=True, help="a directory tree loaded at mount, all durable")
    parser.add_argument("--control", type=Path, required=True, help="the Unix socket for ping and snapshot commands")
    args = parser.parse_args(argv)
    ops = PowerCutOps(_load(args.image, {}))
    server = socketserver.ThreadingUnixStreamServer(str(args.control), _Control)
    server.ops, server.daemon_threads = ops, True
    threading.Thread(target=server.serve_forever, daemon=True).start()

    class _Fuse(mfusepy.FUSE):
        """mfusepy 3.1.1 drops rename's flags (RENAME_EXCHANGE would silently replace) and ftruncate's handle."""

        def rename_fuse_3(self, old, new, flags):
            return self.operations.rename(os.fsdecode(old), os.fsdecode(new), flags)

        def truncate_fuse_3(self, path, length, fip):
            return self.operations.truncate(path and os.fsdecode(path), length, fip.contents.fh if fip else None)

    # hard_remove: an unlink is an unlink, not libfuse's rename to .fuse_hidden* while the file is open;
    # max_idle_threads: libfuse 3.14.0 warns about its own default (UINT_MAX) otherwise
    try:
        _Fuse(ops, str(args.mountpoint), foreground=True, hard_remove=True, use_ino=True, fsname="powercut", max_idle_threads=8)
    except RuntimeError as error:  # fuse_main's status, 8 after SIGTERM
        sys.exit(f"powercut_fs: libfuse ended with status {error}")
    finally:
        args.control.unlink(missing_ok=True)


def _mounted(path: Path) -> bool:
    """Whether path is a mount point, even one whose daemon died (os.path.ismount may say False: ENOTCONN)."""
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == str(path) for line in mounts)


class PowerCutFS:
    """The file system mounted by a process of its own: ``with PowerCutFS.start(mount, image, control) as fs:``."""

    def __init__(self, mount: Path, control: Path, process: subprocess.Popen) -> None:
        self.mount, self.control, self.process = mount, control, process

    @staticmethod
    def start(mount: Path, image: Path, control: Path, timeout: float = 60) -> PowerCutFS:
        mount, control = Path(mount).absolute(), Path(control).absolute()
        mount.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, str(Path(__file__).resolve()), str(mount), "--image", str(image), "--control", str(control)]
        fs = PowerCutFS(mount, control, subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + timeout  # a mount takes well under a second: only a hang gets there
        while fs.process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if os.path.ismount(mount) and fs._ask("ping") == "ok":
                    return fs
            time.sleep(0.02)
        fs.stop()
        raise RuntimeError(f"powercut_fs did not mount {mount} (exit status {fs.process.returncode}; its stderr is above)")

    def _ask(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX) as connection:
            connection.settimeout(600)
            connection.connect(str(self.control))
            connection.sendall(f"{command}\n".encode())
            return connection.makefile().readline().strip()

    def snapshot(self, path: Path) -> Path:
        """Writes the durable state under path (which must not exist): what a power cut now would leave."""
        path = Path(path).absolute()
        reply = self._ask(f"snapshot {path}")
        if not reply.startswith("ok"):
            raise RuntimeError(f"snapshot {path}: {reply}")
        return path

    def settle(self) -> None:
        """Makes everything written so far durable, as if the machine had stayed up long enough to write it back."""
        reply = self._ask("settle")
        if reply != "ok":
            raise RuntimeError(f"settle: {reply}")

    def stop(self) -> None:
        """Unmounts and waits for the process; kills it by its PID if it does not exit."""
        if _mounted(self.mount) and subprocess.run(["fusermount3", "-u", str(self.mount)], capture_output=True).returncode:
            self.process.terminate()  # busy (a file left open): libfuse's SIGTERM handler exits and detaches the mount
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if _mounted(self.mount):  # a killed daemon leaves its mount behind
            subprocess.run(["fusermount3", "-u", "-z", str(self.mount)], capture_output=True)
        self.control.unlink(missing_ok=True)

    def __enter__(self) -> PowerCutFS:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@functools.cache
def why_unavailable() -> str | None:
    """None when the file system can be mounted here, else a one-line reason (for pytest.skip)."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which("fusermount3") is None:
        return "no fusermount3 (Debian package fuse3)"
    if mfusepy is None:
        return f"mfusepy does not import: {_IMPORT_ERROR}"
    with tempfile.TemporaryDirectory(prefix="powercut-") as tmp:
        (Path(tmp) / "image").mkdir()
        try:
            PowerCutFS.start(Path(tmp) / "mount", Path(tmp) / "image", Path(tmp) / "control").stop()
        except Exception as error:
            return " ".join(f"a trial FUSE mount failed: {error}".split())
    return None


if __name__ == "__main__":
    main()
