"""The bounded cache of open log files: the bound holds, a closed descriptor is opened again
on use, unsynced writes survive closing and are made durable by the next sync, a file in use
on another thread is never closed under it, and EMFILE below the bound makes room.
"""

from __future__ import annotations

import errno
import resource
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tidewire.storage import FaultFS, FileHandle, FileSystem, OsFileSystem
from tidewire.storage.filecache import (
    CachedFileSystem,
)
from tidewire.storage.fs import FileHandleWrapper, FileSystemWrapper


class _Counting(FileSystemWrapper):
    """Counts the descriptors of ``inner`` open now; refuses beyond ``emfile_at`` (EMFILE)."""

    def __init__(self, inner: FileSystem, emfile_at: int | None = None) -> None:
        super().__init__(inner)
        self.open_now = 0
        self.peak = 0
        self.emfile_at = emfile_at
        self.opens = 0

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        if self.emfile_at is not None and self.open_now >= self.emfile_at:
            raise OSError(errno.EMFILE, "Too many open files", path)
        f = _CountedFile(super().open(path, create=create), self)
        self.open_now += 1
        self.opens += 1
        self.peak = max(self.peak, self.open_now)
        return f


class _CountedFile(FileHandleWrapper):
    def __init__(self, inner: FileHandle, fs: _Counting) -> None:
        super().__init__(inner)
        self.fs = fs
        self.closed = False
        self.in_pread = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def pread(self, size: int, offset: int) -> bytes:
        self.in_pread.set()
        self.release.wait(10)
        return super().pread(size, offset)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.fs.open_now -= 1
        super().close()


def test_the_bound_holds_and_closed_files_open_again(tmp_path: Path) -> None:
    inner = _Counting(OsFileSystem())
    fs = CachedFileSystem(inner, 4)
    files = [fs.open(str(tmp_path / f"f{i}")) for i in range(50)]
    for i, f in enumerate(files):
        f.pwritev([f"file {i}".encode()], 0)
    assert inner.peak <= 4
    assert fs.open_count <= 4
    for i, f in enumerate(files):
        assert f.pread(100, 0) == f"file {i}".encode()
        assert f.size() == len(f"file {i}")
    assert fs.reopened >= 46
    for f in files:
        f.close()
    assert inner.open_now == 0
    assert fs.open_count == 0


def test_unsynced_writes_survive_closing_and_the_next_sync_makes_them_durable() -> None:
    mem = FaultFS()
    mem.makedirs("/d")
    fs = CachedFileSystem(mem, 1)
    a = fs.open("/d/a")
    a.pwritev([b"not yet synced"], 0)
    b = fs.open("/d/b")  # closes a's descriptor: a has unsynced writes, b none yet
    b.pwritev([b"b"], 0)
    mem.sync_dir("/d")
    reopened = fs.reopened
    a.sync()  # opened again and fsynced
    assert fs.reopened == reopened + 1
    survivor = mem.power_cut()
    assert survivor.read_file("/d/a") == b"not yet synced"
    assert survivor.read_file("/d/b") == b""  # never synced


def test_a_clean_closed_file_needs_no_descriptor_to_sync(tmp_path: Path) -> None:
    fs = CachedFileSystem(OsFileSystem(), 1)
    a = fs.open(str(tmp_path / "a"))
    a.pwritev([b"x"], 0)
    a.sync()
    fs.open(str(tmp_path / "b"))  # a (clean) is closed
    before = fs.reopened
    a.sync()
    a.start_writeback(0, 1)
    assert fs.reopened == before


def test_a_removed_file_is_not_opened_again(tmp_path: Path) -> None:
    fs = CachedFileSystem(OsFileSystem(), 1)
    a = fs.open(str(tmp_path / "a"))
    a.pwritev([b"x"], 0)
    fs.open(str(tmp_path / "b"))  # a closed, with an unsynced write
    fs.remove(str(tmp_path / "a"))
    a.sync()  # nothing to make durable: no error
    a.close()


def test_clean_files_are_closed_before_dirty_ones(tmp_path: Path) -> None:
    fs = CachedFileSystem(OsFileSystem(), 2)
    dirty = fs.open(str(tmp_path / "dirty"))
    dirty.pwritev([b"x"], 0)
    clean = fs.open(str(tmp_path / "clean"))
    clean.pread(1, 0)  # the most recently used
    fs.open(str(tmp_path / "third"))
    before = fs.reopened
    dirty.pwritev([b"y"], 1)  # still open: the clean one was closed
    assert fs.reopened == before


def test_a_file_in_use_on_another_thread_is_not_closed(tmp_path: Path) -> None:
    inner = _Counting(OsFileSystem())
    fs = CachedFileSystem(inner, 1)
    a = fs.open(str(tmp_path / "a"))
    a.pwritev([b"data"], 0)
    counted = a._inner  # type: ignore[attr-defined]
    assert isinstance(counted, _CountedFile)
    counted.release.clear()
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.append(a.pread(4, 0)))
    t.start()
    assert counted.in_pread.wait(10)
    b = fs.open(str(tmp_path / "b"))  # over the bound, since a is busy
    assert not counted.closed
    assert fs.open_count == 2
    counted.release.set()
    t.join(10)
    assert got == [b"data"]
    fs.open(str(tmp_path / "c"))  # now a (idle) or b can be closed
    assert fs.open_count <= 2
    b.close()


def test_emfile_below_the_bound_closes_idle_files_and_retries(tmp_path: Path) -> None:
    inner = _Counting(OsFileSystem(), emfile_at=10)  # sockets took the rest, say
    fs = CachedFileSystem(inner, 1000)
    files = [fs.open(str(tmp_path / f"f{i}")) for i in range(40)]
    assert inner.open_now <= 10
    for i, f in enumerate(files):
        f.pwritev([bytes([i])], 0)
    assert [f.pread(1, 0) for f in files] == [bytes([i]) for i in range(40)]


def test_emfile_with_nothing_to_close_is_logged_with_the_numbers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fs = CachedFileSystem(_Counting(OsFileSystem(), emfile_at=0), 10)
    with pytest.raises(OSError, match="Too many open files"):
        fs.open(str(tmp_path / "a"))
    assert "descriptor limit" in caplog.text


def test_a_renamed_directory_keeps_its_files_reachable(tmp_path: Path) -> None:
    fs = CachedFileSystem(OsFileSystem(), 1)
    (tmp_path / "d").mkdir()
    a = fs.open(str(tmp_path / "d" / "a"))
    a.pwritev([b"moved"], 0)
    fs.open(str(tmp_path / "other"))  # a is closed
    fs.rename(str(tmp_path / "d"), str(tmp_path / "e"))
    assert a.path == str(tmp_path / "e" / "a")
    assert a.pread(5, 0) == b"moved"


def test_the_descriptor_limit_is_raised_to_the_hard_one() -> None:
    # In a child process whose soft limit starts below its hard one, as a shell's ulimit -Sn
    # leaves it: the broker's start raises it to the hard one.
    code = textwrap.dedent(
        """
        import resource
        from tidewire.storage.filecache import (
            descriptor_limit, open_descriptors, raise_descriptor_limit,
        )
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        before, after = raise_descriptor_limit()
        print(before, after, descriptor_limit(), hard, open_descriptors())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    before, after, now, hard = (int(x) for x in out[:4])
    assert before == 256
    assert after == now > 256
    assert hard in (after, resource.RLIM_INFINITY)
    assert out[4] == "None" or 0 < int(out[4]) < after
