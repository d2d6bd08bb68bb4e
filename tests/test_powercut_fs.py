"""The power-cut file system (support/powercut_fs.py) on real FUSE mounts: each snapshot holds what a power cut at
that instant would leave (only what fsync and the fsync of each directory made durable), and the live mount still
shows the current state."""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
from pathlib import Path

import pytest
from support.powercut_fs import RENAME_EXCHANGE, RENAME_NOREPLACE, PowerCutFS, why_unavailable


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and directory (None) under root, by path relative to it."""
    return {path.relative_to(root).as_posix(): None if path.is_dir() else path.read_bytes() for path in root.rglob("*")}


def write(path: Path, data: bytes, fsync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.fixture
def image_files() -> dict[str, bytes | None]:
    """The tree loaded at mount, as tree() reads it: empty unless a test parametrizes it."""
    return {}


@pytest.fixture
def fs(tmp_path, image_files):
    reason = why_unavailable()
    if reason:
        pytest.skip(reason)
    image = tmp_path / "image"
    image.mkdir()
    for name, data in sorted(image_files.items()):
        (image / name).mkdir() if data is None else (image / name).write_bytes(data)
    with PowerCutFS.start(tmp_path / "mnt", image, tmp_path / "control") as mounted:
        yield mounted


@pytest.fixture
def cut(fs, tmp_path):
    """Takes a snapshot into a new directory each call and returns its tree."""
    count = itertools.count()
    return lambda: tree(fs.snapshot(tmp_path / f"cut{next(count)}"))


def test_data_not_fsynced_is_lost(fs, cut):
    write(fs.mount / "f", b"hello")
    fsync_dir(fs.mount)
    assert cut() == {"f": b""}
    assert tree(fs.mount) == {"f": b"hello"}
    write(fs.mount / "f", b"hello", fsync=True)
    assert cut() == {"f": b"hello"}


def test_fsynced_file_needs_its_directory_fsynced(fs, cut):
    write(fs.mount / "f", b"data", fsync=True)
    assert cut() == {}
    assert tree(fs.mount) == {"f": b"data"}
    fsync_dir(fs.mount)
    assert cut() == {"f": b"data"}


def test_rename_not_made_durable_leaves_the_old_name(fs, cut):
    write(fs.mount / "state", b"old", fsync=True)
    write(fs.mount / "state.tmp", b"new", fsync=True)
    fsync_dir(fs.mount)
    os.replace(fs.mount / "state.tmp", fs.mount / "state")
    assert cut() == {"state": b"old", "state.tmp": b"new"}
    assert tree(fs.mount) == {"state": b"new"}
    fsync_dir(fs.mount)
    assert cut() == {"state": b"new"}


def test_open_file_keeps_its_node_through_a_rename(fs, cut):
    fd = os.open(fs.mount / "a", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fsync_dir(fs.mount)
        os.rename(fs.mount / "a", fs.mount / "b")
        os.write(fd, b"written after the rename")
        os.fsync(fd)
    finally:
        os.close(fd)
    assert cut() == {"a": b"written after the rename"}
    assert tree(fs.mount) == {"b": b"written after the rename"}


def test_unlink_not_synced_brings_the_file_back(fs, cut):
    write(fs.mount / "f", b"kept", fsync=True)
    fsync_dir(fs.mount)
    os.unlink(fs.mount / "f")
    assert cut() == {"f": b"kept"}
    assert tree(fs.mount) == {}
    fsync_dir(fs.mount)
    assert cut() == {}


def test_new_directories_need_each_parent_fsynced(fs, cut):
    c = fs.mount / "a" / "b" / "c"
    os.makedirs(c)
    write(c / "file", b"deep", fsync=True)
    fsync_dir(c)
    fsync_dir(c.parent)
    assert cut() == {}
    fsync_dir(fs.mount)
    assert cut() == {"a": None}  # a's entry is durable, its own entries are not
    fsync_dir(fs.mount / "a")
    assert cut() == {"a": None, "a/b": None, "a/b/c": None, "a/b/c/file": b"deep"}
    assert tree(fs.mount) == {"a": None, "a/b": None, "a/b/c": None, "a/b/c/file": b"deep"}


def test_hard_link_keeps_the_content(fs, cut):
    write(fs.mount / "original", b"shared", fsync=True)
    os.link(fs.mount / "original", fs.mount / "link")
    assert os.stat(fs.mount / "link").st_nlink == 2 and os.path.samefile(fs.mount / "original", fs.mount / "link")
    fsync_dir(fs.mount)
    snapshot = fs.snapshot(fs.mount.parent / "linked")
    assert os.path.samefile(snapshot / "original", snapshot / "link")
    os.unlink(fs.mount / "original")
    fsync_dir(fs.mount)
    assert cut() == {"link": b"shared"}
    assert tree(fs.mount) == {"link": b"shared"} and os.stat(fs.mount / "link").st_nlink == 1


@pytest.mark.parametrize(
    "image_files",
    [{"a": None, "a/empty": None, "a/x.bin": bytes(range(256)) * 40, "top.txt": b"top", "z": None, "z/y": None, "z/y/d": b"d"}],
)
def test_image_is_durable_as_it_is(fs, cut, image_files):
    assert cut() == image_files
    assert tree(fs.mount) == image_files


def test_many_snapshots_each_reflect_their_instant(fs, cut):
    cuts = [cut()]
    write(fs.mount / "a", b"1", fsync=True)
    fsync_dir(fs.mount)
    cuts.append(cut())
    fd = os.open(fs.mount / "a", os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"2")
    cuts.append(cut())
    os.fdatasync(fd)
    os.close(fd)
    cuts.append(cut())
    os.mkdir(fs.mount / "d")
    fsync_dir(fs.mount)
    cuts.append(cut())
    os.unlink(fs.mount / "a")
    fsync_dir(fs.mount)
    cuts.append(cut())
    assert cuts == [{}, {"a": b"1"}, {"a": b"1"}, {"a": b"2"}, {"a": b"2", "d": None}, {"d": None}]
    assert tree(fs.mount) == {"d": None}


def test_settle_makes_everything_written_so_far_durable(fs, cut):
    (fs.mount / "d" / "e").mkdir(parents=True)
    write(fs.mount / "d" / "e" / "f", b"unsynced")
    assert cut() == {}
    fs.settle()
    write(fs.mount / "later", b"after the settle")
    assert cut() == {"d": None, "d/e": None, "d/e/f": b"unsynced"}


def test_rename_flags(fs, cut):
    libc = ctypes.CDLL(None, use_errno=True)

    def renameat2(old: Path, new: Path, flags: int) -> int:
        at_fdcwd = -100
        return 0 if libc.renameat2(at_fdcwd, bytes(old), at_fdcwd, bytes(new), flags) == 0 else ctypes.get_errno()

    write(fs.mount / "x", b"x", fsync=True)
    write(fs.mount / "y", b"y", fsync=True)
    fsync_dir(fs.mount)
    assert renameat2(fs.mount / "x", fs.mount / "y", RENAME_NOREPLACE) == errno.EEXIST
    assert renameat2(fs.mount / "x", fs.mount / "y", RENAME_EXCHANGE) == 0
    assert tree(fs.mount) == {"x": b"y", "y": b"x"}
    assert cut() == {"x": b"x", "y": b"y"}
    fsync_dir(fs.mount)
    assert cut() == {"x": b"y", "y": b"x"}
