"""An in-memory file system that fails on purpose: power cuts, torn writes, EIO and ENOSPC.

It models what a real disk keeps after power is lost: a file's bytes become durable only when
the file is synced, and a directory entry (a create, rename or remove) only when its directory
is synced (or the whole file system is: :meth:`FaultFS.open_whole_sync`, Linux's ``syncfs``).
:meth:`FaultFS.power_cut` returns a new file system holding only what survived —
optionally with the unsynced tail of one write torn (a prefix kept) or replaced by garbage.

Faults are scheduled by operation count (every write, sync, truncate, create, rename, remove,
directory sync and whole sync is one operation), so a test can cut power or fail with EIO or
ENOSPC at operation N, deterministically. After a power cut every later operation fails with
:class:`PowerCut`. Thread-safe (one lock), since the storage layer fsyncs from worker threads.
"""

from __future__ import annotations

import errno
import os
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from tidewire.storage.fs import Buffer, FileHandle, FileLock, LockHeldError, WholeSync

__all__ = ["FaultFS", "PowerCut"]


class PowerCut(OSError):
    """Raised by every operation at and after the scheduled power cut."""

    def __init__(self, op: int) -> None:
        super().__init__(errno.EIO, f"power cut at operation {op}")


@dataclass
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    durable_exists: bool = False  # content ever synced


class _MemFile:
    __slots__ = ("_fs", "_inode", "_path")

    def __init__(self, fs: FaultFS, path: str, inode: _Inode) -> None:
        self._fs = fs
        self._path = path
        self._inode = inode

    @property
    def path(self) -> str:
        return self._path

    def pwritev(self, buffers: Sequence[Buffer], offset: int) -> int:
        data = b"".join(bytes(b) for b in buffers)
        with self._fs._lock:
            self._fs._op("write", self._path)
            d = self._inode.data
            if len(d) < offset:
                d.extend(b"\x00" * (offset - len(d)))
            d[offset : offset + len(data)] = data
            self._fs._last_write = (self._inode, offset, len(data))
        return len(data)

    def pread(self, size: int, offset: int) -> bytes:
        with self._fs._lock:
            self._fs._check_alive()
            return bytes(self._inode.data[offset : offset + size])

    def size(self) -> int:
        with self._fs._lock:
            self._fs._check_alive()
            return len(self._inode.data)

    def truncate(self, size: int) -> None:
        with self._fs._lock:
            self._fs._op("truncate", self._path)
            d = self._inode.data
            if size < len(d):
                del d[size:]
            else:
                d.extend(b"\x00" * (size - len(d)))

    def sync(self) -> None:
        with self._fs._lock:
            self._fs._op("sync", self._path)
            self._inode.durable = bytes(self._inode.data)
            self._inode.durable_exists = True

    def start_writeback(self, offset: int, length: int) -> None:
        """A hint, and no operation here: nothing becomes durable without :meth:`sync`."""

    def close(self) -> None:
        pass


class _MemLock:
    __slots__ = ("_fs", "_path")

    def __init__(self, fs: FaultFS, path: str) -> None:
        self._fs = fs
        self._path = path

    def release(self) -> None:
        with self._fs._lock:
            if self._fs._locks.get(self._path, (None,))[0] is self:
                del self._fs._locks[self._path]


class _MemWholeSync:
    """The whole file system's sync: one operation (kind ``"sync_all"``) after which every
    file's bytes and every directory entry are durable."""

    __slots__ = ("_fs", "_path")

    def __init__(self, fs: FaultFS, path: str) -> None:
        self._fs = fs
        self._path = path

    def sync(self) -> None:
        fs = self._fs
        with fs._lock:
            fs._op("sync_all", self._path)
            for inode in fs._names.values():
                inode.durable = bytes(inode.data)
                inode.durable_exists = True
            fs._durable_names = dict(fs._names)

    def close(self) -> None:
        pass


class FaultFS:
    """In-memory :class:`~tidewire.storage.fs.FileSystem` with scheduled faults.

    Locks (:meth:`try_lock`) are held in memory, outside the files and the operation count,
    and a power cut's new file system has none (the processes that held them are gone).

    Attributes:
        ops: operations performed so far.
        cut_at: operation number at which power is cut (``None``: never).
        failures: ``{operation number: errno}`` — that operation fails with that errno once.
        fail_kinds: ``{kind: errno}`` — every operation of that kind (``"write"``, ``"sync"``,
            ...) fails with that errno until the entry is removed.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._names: dict[str, _Inode] = {}
        self._durable_names: dict[str, _Inode] = {}
        self._dirs: set[str] = {"/"}
        self.ops = 0
        self.cut_at: int | None = None
        self.failures: dict[int, int] = {}
        self.fail_kinds: dict[str, int] = {}
        self._dead = False
        self._last_write: tuple[_Inode, int, int] | None = None
        self._locks: dict[str, tuple[_MemLock, bytes]] = {}

    # --- faults -------------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._dead:
            raise PowerCut(self.ops)

    def _op(self, kind: str, path: str) -> None:
        self._check_alive()
        self.ops += 1
        if self.cut_at is not None and self.ops >= self.cut_at:
            self._dead = True
            raise PowerCut(self.ops)
        code = self.failures.pop(self.ops, None) or self.fail_kinds.get(kind)
        if code:
            raise OSError(code, f"{os.strerror(code)} (injected at {kind} #{self.ops})", path)

    @property
    def dead(self) -> bool:
        """Whether power has been cut."""
        return self._dead

    def power_cut(self, rng: random.Random | None = None, *, mode: str = "lose") -> FaultFS:
        """Return a new file system holding what survives a power cut now.

        Args:
            rng: randomness for the torn modes.
            mode: ``"lose"``: every file reverts to its synced bytes; ``"torn"``: the file of
                the last write keeps a random prefix of its unsynced tail; ``"garbage"``: that
                tail keeps its length but a random suffix of it is replaced by random bytes.
        """
        rng = rng or random.Random(0)
        with self._lock:
            self._dead = True
            new = FaultFS()
            new._dirs = set(self._dirs)
            torn_inode = self._last_write[0] if self._last_write else None
            for path, inode in self._durable_names.items():
                content = inode.durable if inode.durable_exists else b""
                if mode != "lose" and inode is torn_inode and inode.data.startswith(content):
                    extra = bytes(inode.data[len(content) :])
                    if extra:
                        keep = rng.randrange(0, len(extra) + 1)
                        if mode == "torn":
                            content += extra[:keep]
                        else:
                            tail = bytes(rng.getrandbits(8) for _ in range(len(extra) - keep))
                            content += extra[:keep] + tail
                new._names[path] = _Inode(bytearray(content), content, True)
            new._durable_names = dict(new._names)
            return new

    # --- inspection and tampering, for tests ----------------------------------------------------

    def files(self) -> list[str]:
        """Every file path, sorted."""
        with self._lock:
            return sorted(self._names)

    def contents(self, path: str) -> bytes:
        """A file's current bytes."""
        with self._lock:
            return bytes(self._names[path].data)

    def set_contents(self, path: str, data: bytes) -> None:
        """Replace a file's bytes, durably, without counting an operation (test tampering)."""
        with self._lock:
            inode = self._names.get(path)
            if inode is None:
                inode = self._names[path] = _Inode()
                self._durable_names[path] = inode
            inode.data = bytearray(data)
            inode.durable = bytes(data)
            inode.durable_exists = True

    # --- FileSystem -----------------------------------------------------------------------------

    def try_lock(self, path: str, holder: bytes) -> FileLock:
        path = os.path.normpath(path)
        with self._lock:
            self._check_alive()
            held = self._locks.get(path)
            if held is not None:
                raise LockHeldError(path, held[1])
            lock = _MemLock(self, path)
            self._locks[path] = (lock, bytes(holder))
            return lock

    def open(self, path: str, *, create: bool = True) -> FileHandle:
        path = os.path.normpath(path)
        with self._lock:
            inode = self._names.get(path)
            if inode is None:
                if not create:
                    self._check_alive()
                    raise FileNotFoundError(errno.ENOENT, "no such file", path)
                if os.path.dirname(path) not in self._dirs:
                    raise FileNotFoundError(errno.ENOENT, "no such directory", path)
                self._op("create", path)
                inode = self._names[path] = _Inode()
            else:
                self._check_alive()
            return _MemFile(self, path, inode)

    def exists(self, path: str) -> bool:
        path = os.path.normpath(path)
        with self._lock:
            return path in self._names or path in self._dirs

    def listdir(self, path: str) -> list[str]:
        path = os.path.normpath(path)
        with self._lock:
            self._check_alive()
            if path not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", path)
            names = {os.path.basename(p) for p in self._names if os.path.dirname(p) == path}
            names |= {os.path.basename(d) for d in self._dirs if os.path.dirname(d) == path}
            names.discard("")
            return sorted(names)

    def makedirs(self, path: str) -> None:
        path = os.path.normpath(path)
        with self._lock:
            self._check_alive()
            while path not in self._dirs:
                self._dirs.add(path)
                path = os.path.dirname(path)

    def remove(self, path: str) -> None:
        path = os.path.normpath(path)
        with self._lock:
            self._op("remove", path)
            if path not in self._names:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            del self._names[path]

    def rename(self, src: str, dst: str) -> None:
        src, dst = os.path.normpath(src), os.path.normpath(dst)
        with self._lock:
            self._op("rename", src)
            if src in self._dirs:
                self._rename_dir(src, dst)
                return
            if src not in self._names:
                raise FileNotFoundError(errno.ENOENT, "no such file", src)
            self._names[dst] = self._names.pop(src)

    def _rename_dir(self, src: str, dst: str) -> None:
        # Directory renames are durable at once: this model keeps directory structure simple.
        prefix = src + "/"
        for table in (self._names, self._durable_names):
            for p in [p for p in table if p.startswith(prefix)]:
                table[dst + "/" + p[len(prefix) :]] = table.pop(p)
        self._dirs = {
            dst + d[len(src) :] if d == src or d.startswith(prefix) else d for d in self._dirs
        }

    def rmtree(self, path: str) -> None:
        path = os.path.normpath(path)
        prefix = path + "/"
        with self._lock:
            self._op("remove", path)
            for table in (self._names, self._durable_names):
                for p in [p for p in table if p.startswith(prefix)]:
                    del table[p]
            self._dirs = {d for d in self._dirs if d != path and not d.startswith(prefix)}

    def sync_dir(self, path: str) -> None:
        path = os.path.normpath(path)
        with self._lock:
            self._op("sync_dir", path)
            for p in [p for p in self._durable_names if os.path.dirname(p) == path]:
                del self._durable_names[p]
            for p, inode in self._names.items():
                if os.path.dirname(p) == path:
                    self._durable_names[p] = inode

    def read_file(self, path: str) -> bytes:
        path = os.path.normpath(path)
        with self._lock:
            self._check_alive()
            inode = self._names.get(path)
            if inode is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            return bytes(inode.data)

    def open_whole_sync(self, path: str) -> WholeSync | None:
        path = os.path.normpath(path)
        with self._lock:
            self._check_alive()
            if path not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", path)
            return _MemWholeSync(self, path)
