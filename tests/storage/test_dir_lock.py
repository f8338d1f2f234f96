"""The data directory's lock: taken by :meth:`LogManager.open` before anything in the
directory is read or written, refused to a second opener with the holder's pid, released at
close, when the manager is abandoned (a crash) and when the open itself fails; on the real file
system (``flock``) and in :class:`FaultFS`."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidewire.errors import DataDirLockedError, StorageError
from tidewire.records import build_batch
from tidewire.storage import FaultFS, FileSystem, LogManager, OsFileSystem
from tidewire.storage.fs import LockHeldError
from tidewire.storage.manager import CLEAN_SHUTDOWN_FILE, LOCK_FILE


def batch(value: bytes) -> bytes:
    return build_batch([value], timestamp_ms=1_700_000_000_000)


@pytest.fixture(params=["faultfs", "osfs"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[FileSystem, str]:
    if request.param == "faultfs":
        return FaultFS(), "/data"
    return OsFileSystem(), str(tmp_path / "data")


def test_a_second_opener_is_refused_and_touches_nothing(where: tuple[FileSystem, str]) -> None:
    fs, d = where
    first = LogManager(d, fs=fs).open()
    first.create_log("t", 0).append(batch(b"a"))
    names = fs.listdir(d)
    ops = fs.ops if isinstance(fs, FaultFS) else None
    with pytest.raises(DataDirLockedError) as refused:
        LogManager(d, fs=fs).open()
    message = refused.value.message
    assert f"data directory {d} is in use by another broker in this process" in message
    assert f"(pid {os.getpid()})" in message
    assert f"{d}/{LOCK_FILE}" in message
    assert fs.listdir(d) == names
    if isinstance(fs, FaultFS):
        assert fs.ops == ops  # not one write, sync, create, rename or remove
    # The first is undisturbed, and once it is closed the directory opens again.
    assert first.get_log("t", 0).append(batch(b"b")).base_offset == 1
    first.close()
    again = LogManager(d, fs=fs).open()
    assert again.was_clean
    assert again.get_log("t", 0).log_end_offset == 2
    again.close()


def test_a_crash_releases_the_lock(where: tuple[FileSystem, str]) -> None:
    fs, d = where
    first = LogManager(d, fs=fs).open()
    first.create_log("t", 0).append(batch(b"a"))
    first.abandon()  # what a killed process leaves: no marker, no checkpoint, no lock
    again = LogManager(d, fs=fs).open()
    assert not again.was_clean
    assert again.get_log("t", 0).log_end_offset == 1
    again.close()


def test_a_failed_open_releases_the_lock(where: tuple[FileSystem, str]) -> None:
    fs, d = where
    first = LogManager(d, fs=fs).open()
    first.create_log("t", 0)
    first.close()
    # A file where a partition's directory should be: opening that log fails, so the whole
    # open does (an unreadable log.json no longer does: that partition goes offline).
    if isinstance(fs, FaultFS):
        fs.fail_kinds["sync_dir"] = errno.EIO
    else:
        Path(d, "t-1").write_text("not a partition directory")
    with pytest.raises(StorageError, match=r"cannot open (log|data directory)"):
        LogManager(d, fs=fs).open()
    if isinstance(fs, FaultFS):
        fs.fail_kinds.clear()
    else:
        Path(d, "t-1").unlink()
    LogManager(d, fs=fs).open().close()  # the failed open left the lock free


def test_the_lock_file_names_its_holder_while_held(tmp_path: Path) -> None:
    d = tmp_path / "data"
    mgr = LogManager(str(d)).open()
    assert (d / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    assert mgr.topics() == {}  # the lock file is no log
    assert CLEAN_SHUTDOWN_FILE not in os.listdir(d)
    mgr.close()
    assert (d / LOCK_FILE).read_text() == ""
    assert CLEAN_SHUTDOWN_FILE in os.listdir(d)


def test_try_lock_on_the_real_file_system(tmp_path: Path) -> None:
    fs = OsFileSystem()
    path = str(tmp_path / "x.lock")
    held = fs.try_lock(path, b"123\n")
    with pytest.raises(LockHeldError) as exc:
        fs.try_lock(path, b"456\n")
    assert exc.value.holder == b"123\n"
    assert (tmp_path / "x.lock").read_bytes() == b"123\n"  # the refused one wrote nothing
    held.release()
    held.release()  # twice is harmless
    fs.try_lock(path, b"789\n").release()


def test_release_unlocks_even_with_a_child_holding_the_descriptor(tmp_path: Path) -> None:
    """A child started (or forked) while the lock was held shares its descriptor: release
    must unlock it explicitly, not rely on the last copy being closed."""
    fs = OsFileSystem()
    path = str(tmp_path / "x.lock")
    held = fs.try_lock(path, b"1\n")
    fd = held._fd  # type: ignore[attr-defined]
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        pass_fds=(fd,),
    )
    try:
        held.release()
        fs.try_lock(path, b"2\n").release()
    finally:
        assert child.stdin is not None
        child.stdin.close()  # the child ends on end of input
        child.wait(timeout=30)


def test_try_lock_in_faultfs_and_after_a_power_cut() -> None:
    fs = FaultFS()
    fs.makedirs("/d")
    held = fs.try_lock("/d/.lock", b"1\n")
    with pytest.raises(LockHeldError) as exc:
        fs.try_lock("/d/.lock", b"2\n")
    assert exc.value.holder == b"1\n"
    # The power cut ends every process: the new file system has no lock held.
    fs.power_cut().try_lock("/d/.lock", b"3\n")
    held.release()
