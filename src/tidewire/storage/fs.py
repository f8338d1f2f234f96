"""The file-system seam: every byte the storage engine reads or writes goes through here.

:class:`FileSystem` and :class:`FileHandle` are the narrow interface the storage layer uses;
:class:`OsFileSystem` is the real one (``os.pwritev``, ``os.pread``, ``os.fdatasync``), and
:mod:`tidewire.storage.faultfs` is an in-memory one that can cut power, tear the last write,
and fail with EIO or ENOSPC at a chosen operation, deterministically.

Errors are raised as :class:`OSError` with their ``errno``; the storage layer turns them into
:class:`~tidewire.errors.StorageError` with the operation and path named.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import shutil
import sys
from collections.abc import Sequence
from typing import Protocol

__all__ = [
    "FileHandle",
    "FileHandleWrapper",
    "FileLock",
    "FileSystem",
    "FileSystemWrapper",
    "LockHeldError",
    "OsFileSystem",
    "WholeSync",
    "write_atomic",
]

Buffer = bytes | bytearray | memoryview


class FileHandle(Protocol):
    """An open file, read and written by position."""

    @property
    def path(self) -> str: ...

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        """Write all of ``buffers`` at ``offset``; return the byte count. Never short."""
        ...

    def pread(self, size: int, offset: int) -> bytes:
        """Read up to ``size`` bytes at ``offset`` (fewer at the end of the file)."""
        ...

    def size(self) -> int: ...

    def truncate(self, size: int) -> None: ...

    def sync(self) -> None:
        """Make the file's data durable (fdatasync)."""
        ...

    def start_writeback(self, offset: int, length: int) -> None:
        """Ask the OS to start writing ``length`` bytes at ``offset`` back to the device and
        return without waiting (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; nothing
        elsewhere). A hint: only :meth:`sync` makes data durable."""
        ...

    def close(self) -> None: ...


class FileLock(Protocol):
    """An exclusive lock held on a file (see :meth:`FileSystem.try_lock`)."""

    def release(self) -> None:
        """Give the lock up (twice is harmless)."""
        ...


class LockHeldError(OSError):
    """:meth:`FileSystem.try_lock` found the lock held by someone else.

    Attributes:
        holder: what the holder wrote into the lock file (empty if it has not yet).
    """

    def __init__(self, path: str, holder: bytes) -> None:
        super().__init__(errno.EWOULDBLOCK, "the lock is held", path)
        self.holder = holder


class WholeSync(Protocol):
    """One sync of the whole file system holding a path (Linux ``syncfs``), watching for
    write-back errors from the moment it was opened (:meth:`FileSystem.open_whole_sync`)."""

    def sync(self) -> None:
        """Make durable every file's bytes and every directory entry written on the file
        system, by anyone, before this call (as if each file and directory had been synced).

        Raises:
            OSError: the sync failed, or some write-back on the file system failed since this
                was opened (so a file written after the open may not be durable).
        """
        ...

    def close(self) -> None: ...


class FileSystem(Protocol):
    """Directory and file operations the storage layer needs."""

    def try_lock(self, path: str, holder: bytes) -> FileLock:
        """Take an exclusive lock on ``path`` (created if missing) without waiting, and
        write ``holder`` into it for whoever finds it held. The lock lasts until
        :meth:`FileLock.release` or the end of the process, whichever comes first.

        Raises:
            LockHeldError: another holder has it (in this process or another).
            OSError: the file cannot be created or written.
        """
        ...

    def open(self, path: str, *, create: bool = True) -> FileHandle: ...

    def exists(self, path: str) -> bool: ...

    def listdir(self, path: str) -> list[str]: ...

    def makedirs(self, path: str) -> None: ...

    def remove(self, path: str) -> None: ...

    def rename(self, src: str, dst: str) -> None: ...

    def rmtree(self, path: str) -> None: ...

    def sync_dir(self, path: str) -> None:
        """Make the directory's entries (creates, renames, removes) durable."""
        ...

    def read_file(self, path: str) -> bytes: ...

    def open_whole_sync(self, path: str) -> WholeSync | None:
        """A :class:`WholeSync` of the file system holding the directory ``path``; open it
        before writing what it is to make durable (write-back errors from then on are
        reported by its sync). ``None`` where the system has no such sync: sync each file and
        directory instead."""
        ...


#: sync_file_range's flag: start writeback of the dirty pages in the range, do not wait.
SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """libc's ``sync_file_range`` (Linux), or ``None`` where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


def _load_syncfs() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """libc's ``syncfs`` (Linux), or ``None`` where there is none. It reports write-back
    errors (since Linux 5.8) that happened on the file system after its descriptor was
    opened; on older kernels it reports none, so it is not used there."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < (5, 8):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_syncfs = _load_syncfs()


class _OsWholeSync:
    """``syncfs`` through a descriptor of a directory, opened before the writes it covers:
    the kernel reports to it the write-back errors of the file system since its open."""

    __slots__ = ("_fd", "_path")

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))

    def sync(self) -> None:
        assert _syncfs is not None
        if _syncfs(self._fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"syncfs: {os.strerror(code)}", self._path)

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class _OsFile:
    __slots__ = ("_fd", "_path")

    def __init__(self, path: str, fd: int) -> None:
        self._path = path
        self._fd = fd

    @property
    def path(self) -> str:
        return self._path

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        total = sum(map(len, buffers))
        written = os.pwritev(self._fd, buffers, offset)
        if written != total:  # a short write: finish it piecewise
            data = b"".join(buffers)
            while written < total:
                n = os.pwrite(self._fd, data[written:], offset + written)
                if n == 0:
                    raise OSError(f"pwrite made no progress on {self._path}")
                written += n
        return total

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def start_writeback(self, offset: int, length: int) -> None:
        if _sync_file_range is None or length <= 0:
            return
        if _sync_file_range(self._fd, offset, length, SYNC_FILE_RANGE_WRITE) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"sync_file_range: {os.strerror(code)}", self._path)

    def close(self) -> None:
        if self._fd >= 0:  # twice is harmless: the number may belong to another file by then
            fd, self._fd = self._fd, -1
            os.close(fd)


class _OsLock:
    """An ``flock`` held through an open descriptor: closing it (or the process ending, even
    by SIGKILL) releases it."""

    __slots__ = ("_fd", "_path")

    def __init__(self, path: str, fd: int) -> None:
        self._path = path
        self._fd = fd

    def release(self) -> None:
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        try:
            # No stale holder left for the next reader of the file. Only informative:
            # closing the descriptor is what releases the lock, so a failure here is moot.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            # Unlocked explicitly: a child forked meanwhile shares the descriptor, and the
            # lock would otherwise last as long as its copy.
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


class OsFileSystem:
    """The real file system."""

    def try_lock(self, path: str, holder: bytes) -> FileLock:
        # Never O_TRUNC: the file may be held by someone else, whose holder must stay.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                held_by = os.pread(fd, 4096, 0)
            finally:
                os.close(fd)
            raise LockHeldError(path, held_by) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder, 0)
        except BaseException:
            os.close(fd)
            raise
        return _OsLock(path, fd)

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        flags = os.O_RDWR | (os.O_CREAT if create else 0) | getattr(os, "O_CLOEXEC", 0)
        return _OsFile(path, os.open(path, flags, 0o644))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def remove(self, path: str) -> None:
        os.remove(path)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def rmtree(self, path: str) -> None:
        shutil.rmtree(path)

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def open_whole_sync(self, path: str) -> WholeSync | None:
        if _syncfs is None:
            return None
        return _OsWholeSync(path)


def write_atomic(fs: FileSystem, path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash at any step leaves the old file or the
    new one, never a mix: write ``path.tmp``, fsync it, rename over ``path``, fsync the
    directory.

    Raises:
        OSError: from the file system; ``path`` is then unchanged or wholly replaced.
    """
    _write_tmp(fs, path, data, sync=True)
    fs.rename(path + ".tmp", path)
    fs.sync_dir(os.path.dirname(path) or ".")


def _write_tmp(fs: FileSystem, path: str, data: bytes, *, sync: bool) -> None:
    """Write ``data`` as ``path.tmp`` (fsynced if ``sync``)."""
    f = fs.open(path + ".tmp", create=True)
    try:
        f.truncate(0)
        f.pwritev([data], 0)
        if sync:
            f.sync()
    finally:
        f.close()


#: :func:`write_atomic_many` of this many files or more uses two syncs of the whole file
#: system (where there is ``syncfs``) rather than two fsyncs a file.
WRITE_MANY_WHOLE_SYNC_FROM = 16


def write_atomic_many(
    fs: FileSystem, files: list[tuple[str, bytes]], root: str
) -> list[OSError | None]:
    """:func:`write_atomic` of each of ``files`` (path, data), all under the directory
    ``root``, each replaced wholly or not at all; the error of each, or ``None``.

    From :data:`WRITE_MANY_WHOLE_SYNC_FROM` files on, where the system has a sync of the whole
    file system (:meth:`FileSystem.open_whole_sync`): every ``path.tmp`` is written, one sync
    makes them durable, each is renamed over its path, and a second sync makes the renames
    durable. A crash at any step leaves each path's old file or its new one, as
    :func:`write_atomic` does, with two syncs instead of two a file (10,000 files of the
    reference machine: about 20 s at two fsyncs a file).

    Raises:
        OSError: a sync of the whole file system failed (then every file that was renamed may
            or may not be durable; none is half written).
    """
    whole: WholeSync | None = None
    if len(files) >= WRITE_MANY_WHOLE_SYNC_FROM:
        try:
            whole = fs.open_whole_sync(root)  # before anything is written: see WholeSync
        except OSError:
            whole = None
    if whole is None:
        errors: list[OSError | None] = []
        for path, data in files:
            try:
                write_atomic(fs, path, data)
            except OSError as exc:
                errors.append(exc)
            else:
                errors.append(None)
        return errors
    try:
        errors = []
        for path, data in files:
            try:
                _write_tmp(fs, path, data, sync=False)
            except OSError as exc:
                errors.append(exc)
                _remove_quietly(fs, path + ".tmp")
            else:
                errors.append(None)
        try:
            whole.sync()
        except OSError:
            for path, _ in files:
                _remove_quietly(fs, path + ".tmp")
            raise
        for i, (path, _) in enumerate(files):
            if errors[i] is None:
                try:
                    fs.rename(path + ".tmp", path)
                except OSError as exc:
                    errors[i] = exc
        whole.sync()
        return errors
    finally:
        whole.close()


def _remove_quietly(fs: FileSystem, path: str) -> None:
    """Remove ``path`` if it is there; a failure is left for the next recovery to clean."""
    with contextlib.suppress(OSError):
        fs.remove(path)


class FileHandleWrapper:
    """A :class:`FileHandle` that forwards every call to ``inner``: subclass it to observe or
    alter some calls (count fsyncs, inject faults) and keep the rest."""

    def __init__(self, inner: FileHandle) -> None:
        self.inner = inner

    @property
    def path(self) -> str:
        return self.inner.path

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        return self.inner.pwritev(buffers, offset)

    def pread(self, size: int, offset: int) -> bytes:
        return self.inner.pread(size, offset)

    def size(self) -> int:
        return self.inner.size()

    def truncate(self, size: int) -> None:
        self.inner.truncate(size)

    def sync(self) -> None:
        self.inner.sync()

    def start_writeback(self, offset: int, length: int) -> None:
        self.inner.start_writeback(offset, length)

    def close(self) -> None:
        self.inner.close()


class FileSystemWrapper:
    """A :class:`FileSystem` that forwards every call to ``inner``; subclasses override what
    they observe or alter (``open`` may wrap handles in a :class:`FileHandleWrapper`)."""

    def __init__(self, inner: FileSystem) -> None:
        self.inner = inner

    def try_lock(self, path: str, holder: bytes) -> FileLock:
        return self.inner.try_lock(path, holder)

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        return self.inner.open(path, create=create)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def makedirs(self, path: str) -> None:
        self.inner.makedirs(path)

    def remove(self, path: str) -> None:
        self.inner.remove(path)

    def rename(self, src: str, dst: str) -> None:
        self.inner.rename(src, dst)

    def rmtree(self, path: str) -> None:
        self.inner.rmtree(path)

    def sync_dir(self, path: str) -> None:
        self.inner.sync_dir(path)

    def read_file(self, path: str) -> bytes:
        return self.inner.read_file(path)

    def open_whole_sync(self, path: str) -> WholeSync | None:
        return self.inner.open_whole_sync(path)
