"""A bound on the files the storage engine keeps open, and the process's descriptor limit.

Every segment of every partition is a file; a broker of 10,000 partitions would otherwise hold
10,000 descriptors or more, and a process under ``ulimit -n 1024`` would fail its writes (and
its next start) with "Too many open files". :class:`CachedFileSystem` wraps a
:class:`~tidewire.storage.fs.FileSystem`: each file it opens is a handle whose descriptor may be
closed while idle and opened again, by path, on its next use; at most ``max_open`` descriptors
are open at once (the least recently used idle one is closed to make room; handles in use at
that moment, in another thread, are never closed under it).

Durability: closing a descriptor loses nothing written through it (the data is in the page
cache, attached to the file, not the descriptor), and ``fdatasync`` on a descriptor opened
later writes back every dirty page of the file, whichever descriptor wrote it. On Linux since
4.16 a write-back error is also reported to the next ``fsync`` of a descriptor opened after it,
if nobody has seen it yet. So a handle closed with unsynced writes is simply opened again by
its next :meth:`~tidewire.storage.fs.FileHandle.sync`, which fsyncs as the policy asks; idle
handles with nothing unsynced are preferred for closing, so that this is rare. A file removed
through this file system is not opened again: there is nothing left to make durable.

When an open fails with EMFILE or ENFILE (descriptors taken by sockets, say), half of the idle
descriptors are closed and the open is tried once more; if that fails too, the error is logged
with the limit and the descriptors in use, and raised.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Sequence

from tidewire.storage.fs import Buffer, FileHandle, FileSystem, FileSystemWrapper

__all__ = [
    "CachedFileSystem",
    "descriptor_limit",
    "open_descriptors",
    "raise_descriptor_limit",
]

log = logging.getLogger("tidewire.storage")

#: Idle handles looked at, oldest first, for one with nothing unsynced before settling for the
#: oldest idle one: bounds the work of one open.
EVICTION_SCAN = 64


def descriptor_limit() -> int:
    """The soft limit on open descriptors (RLIMIT_NOFILE) of this process."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft descriptor limit to the hard one (as far as the OS allows).

    Returns:
        ``(before, after)``: the soft limit before and now.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if target == resource.RLIM_INFINITY:
        # Linux refuses an infinite soft limit for NOFILE; fs.nr_open is the real ceiling.
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, target, exc)
    return soft, descriptor_limit()


def open_descriptors() -> int | None:
    """How many descriptors this process has open (``None`` where that cannot be read)."""
    for d in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(d)) - 1  # the listing's own descriptor
        except OSError:
            continue
    return None


class _CachedFile:
    """A file whose descriptor the cache may close while idle (see the module docstring)."""

    __slots__ = ("_busy", "_cache", "_closed", "_inner", "_path", "_removed", "_synced", "_writes")

    def __init__(self, cache: CachedFileSystem, path: str, inner: FileHandle) -> None:
        self._cache = cache
        self._path = path
        self._inner: FileHandle | None = inner
        self._busy = 0  # calls running now, on any thread: never closed under them
        self._closed = False
        self._removed = False
        self._writes = 0  # writes and truncations so far
        self._synced = 0  # ... of which the last successful sync covered this many

    @property
    def path(self) -> str:
        return self._path

    @property
    def dirty(self) -> bool:
        return self._writes != self._synced

    def _use(self) -> FileHandle:
        return self._cache._use(self)

    def _done(self) -> None:
        with self._cache._lock:
            self._busy -= 1

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        inner = self._use()
        try:
            self._writes += 1
            return inner.pwritev(buffers, offset)
        finally:
            self._done()

    def pread(self, size: int, offset: int) -> bytes:
        inner = self._use()
        try:
            return inner.pread(size, offset)
        finally:
            self._done()

    def size(self) -> int:
        inner = self._use()
        try:
            return inner.size()
        finally:
            self._done()

    def truncate(self, size: int) -> None:
        inner = self._use()
        try:
            self._writes += 1
            inner.truncate(size)
        finally:
            self._done()

    def sync(self) -> None:
        with self._cache._lock:
            if self._inner is None and (self._removed or not self.dirty):
                return  # closed with nothing unsynced, or the file is gone
        inner = self._use()
        try:
            writes = self._writes
            inner.sync()
            self._synced = max(self._synced, writes)
        finally:
            self._done()

    def start_writeback(self, offset: int, length: int) -> None:
        with self._cache._lock:
            inner = self._inner
            if inner is None:
                return  # a hint: not worth a descriptor
            self._busy += 1
        try:
            inner.start_writeback(offset, length)
        finally:
            self._done()

    def close(self) -> None:
        self._cache._close(self)


class CachedFileSystem(FileSystemWrapper):
    """``inner`` with at most ``max_open`` of its files' descriptors open at once.

    Attributes:
        max_open: the bound.
        reopened: descriptors opened again for a handle whose descriptor had been closed.
        evicted: descriptors closed to make room.
    """

    def __init__(self, inner: FileSystem, max_open: int) -> None:
        super().__init__(inner)
        if max_open < 1:
            raise ValueError(f"max_open={max_open} must be >= 1")
        self.max_open = max_open
        self.reopened = 0
        self.evicted = 0
        self._lock = threading.Lock()
        #: Handles whose descriptor is open, least recently used first.
        self._lru: OrderedDict[_CachedFile, None] = OrderedDict()
        self._handles: dict[str, set[_CachedFile]] = {}  # by path: open or not, not closed
        self._dirs: dict[str, set[str]] = {}  # directory -> the paths above in it

    @property
    def open_count(self) -> int:
        """Descriptors open now."""
        return len(self._lru)

    # --- FileSystem -------------------------------------------------------------------------

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        with self._lock:
            inner = self._open_inner(path, create)
            f = _CachedFile(self, path, inner)
            self._lru[f] = None
            self._track(f)
        return f

    def remove(self, path: str) -> None:
        self.inner.remove(path)
        with self._lock:
            for f in self._handles.get(path, ()):
                f._removed = True

    def rmtree(self, path: str) -> None:
        """(Files are looked up by their directory: the storage layer's trees are one level
        deep, a partition directory of files.)"""
        self.inner.rmtree(path)
        with self._lock:
            for p in self._dirs.get(path.rstrip("/"), ()):
                for f in self._handles.get(p, ()):
                    f._removed = True

    def rename(self, src: str, dst: str) -> None:
        self.inner.rename(src, dst)
        src, dst = src.rstrip("/"), dst.rstrip("/")
        with self._lock:
            moved = [src] if src in self._handles else []
            moved += list(self._dirs.get(src, ()))
            for p in moved:
                self._move(p, dst if p == src else dst + p[len(src) :])

    # --- the cache (under the lock) ---------------------------------------------------------

    def _track(self, f: _CachedFile) -> None:
        self._handles.setdefault(f._path, set()).add(f)
        self._dirs.setdefault(os.path.dirname(f._path), set()).add(f._path)

    def _untrack(self, f: _CachedFile) -> None:
        handles = self._handles.get(f._path)
        if handles is None:
            return
        handles.discard(f)
        if not handles:
            del self._handles[f._path]
            d = os.path.dirname(f._path)
            paths = self._dirs.get(d)
            if paths is not None:
                paths.discard(f._path)
                if not paths:
                    del self._dirs[d]

    def _move(self, old: str, new: str) -> None:
        for f in list(self._handles.get(old, ())):
            self._untrack(f)
            f._path = new
            self._track(f)

    def _use(self, f: _CachedFile) -> FileHandle:
        with self._lock:
            inner = f._inner
            if inner is None:
                if f._closed:
                    raise OSError(errno.EBADF, "file handle is closed", f._path)
                inner = f._inner = self._open_inner(f._path, False)
                self.reopened += 1
                self._lru[f] = None
            else:
                self._lru.move_to_end(f)
            f._busy += 1
            return inner

    def _close(self, f: _CachedFile) -> None:
        with self._lock:
            if f._closed:
                return
            f._closed = True
            self._untrack(f)
            inner, f._inner = f._inner, None
            self._lru.pop(f, None)
        if inner is not None:
            inner.close()

    def _open_inner(self, path: str, create: bool) -> FileHandle:
        while len(self._lru) >= self.max_open and self._evict_one():
            pass
        try:
            return self.inner.open(path, create=create)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            first = exc
        # Descriptors ran out below our own bound (sockets took them): make room and retry.
        for _ in range(len(self._lru) // 2):
            if not self._evict_one():
                break
        try:
            return self.inner.open(path, create=create)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                log.error(
                    "cannot open %s: %s (descriptor limit %d, %s open, %d of them log files)",
                    path,
                    exc.strerror,
                    descriptor_limit(),
                    open_descriptors(),
                    len(self._lru),
                )
            raise exc from first

    def _evict_one(self) -> bool:
        """Close the least recently used idle descriptor, preferring one with nothing
        unsynced. Returns ``False`` when every open one is in use."""
        victim: _CachedFile | None = None
        for i, f in enumerate(self._lru):
            if i >= EVICTION_SCAN and victim is not None:
                break
            if f._busy:
                continue
            if not f.dirty:
                victim = f
                break
            if victim is None:
                victim = f
        if victim is None:
            return False
        inner, victim._inner = victim._inner, None
        del self._lru[victim]
        self.evicted += 1
        if inner is not None:
            try:
                inner.close()
            except OSError as exc:  # the data stays in the file: nothing is lost
                log.warning("closing idle %s: %s", victim._path, exc)
        return True
