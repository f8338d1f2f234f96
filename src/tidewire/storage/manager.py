"""The log manager: one data directory holding every topic's partition logs.

Layout::

    DATA_DIR/
      .lock                                held (flock) by the broker that has it open: its pid
      .clean-shutdown                      present only between a clean close and the next open
      recovery-point-offset-checkpoint     JSON {"version": 1, "logs": {"TOPIC-P": offset}}
      TOPIC-P/                             one directory per partition
        log.json                           the log's LogConfig
        00000000000000000000.log           segments, indexes (see tidewire.storage.segment)
        00000000000000000000.index
        00000000000000000000.timeindex
      TOPIC-P.<hex>-delete/                a deleted partition awaiting removal
      TOPIC.creating                       a topic creation under way (tidewire.storage.creation)
      creations+HEX.creating               several creations made together, under way

Every metadata file is written atomically (temp, write, fsync, rename, fsync dir). On open,
the clean-shutdown marker lets every log trust its intact indexes and skip the scan; it is
removed (durably) before the first write. The recovery-point checkpoint is rewritten every
``checkpoint_interval_ms`` and at close.

One broker at a time: :meth:`LogManager.open` takes an exclusive lock on ``.lock`` (through
the file system's :meth:`~tidewire.storage.fs.FileSystem.try_lock`: ``flock`` on the real
one) before it reads or writes anything else, and holds it until :meth:`LogManager.close`
(or the end of the process, however it ends). A second opener, in another process or this
one, is refused with :class:`~tidewire.errors.DataDirLockedError` naming the holder's pid:
two brokers appending to one log would overwrite each other's acknowledged messages.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import re
import resource
import threading
import time
import uuid
from collections.abc import Callable

from tidewire._tasks import wait_event
from tidewire.errors import (
    DataDirLockedError,
    InvalidConfigError,
    LogExistsError,
    LogNotFoundError,
    NotLeaderError,
    StorageError,
    TidewireError,
)
from tidewire.storage.config import FsyncPolicy, LogConfig
from tidewire.storage.creation import (
    Creation,
    create_many,
    create_partitions,
    finish_deleting,
    mark_deleting,
    remove_half_created,
)
from tidewire.storage.filecache import CachedFileSystem
from tidewire.storage.fs import FileLock, FileSystem, LockHeldError, OsFileSystem, write_atomic
from tidewire.storage.log import (
    DEFAULT_PREALLOCATE_BYTES,
    Clock,
    FlushStats,
    PartitionLog,
    check_preallocate_bytes,
    describe_os_error,
    wall_clock_ms,
)

__all__ = ["LogManager", "validate_topic_name"]

log = logging.getLogger("tidewire.storage")

LOCK_FILE = ".lock"
CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
RECOVERY_CHECKPOINT_FILE = "recovery-point-offset-checkpoint"
LOG_CONFIG_FILE = "log.json"
#: Topic names: Kafka's characters, but 200 of them rather than Kafka's 249, so that the longest
#: directory name, "NAME-99999.<32 hex>-delete" (NAME + 46), fits the 255-byte file name limit.
MAX_TOPIC_NAME = 200
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]+")
_PARTITION_DIR_RE = re.compile(r"^([A-Za-z0-9._-]+)-(\d+)$")
#: Topics of more partitions than this are deleted by a marker, their files removed in the
#: background (see tidewire.storage.creation); smaller ones before the deletion returns.
BACKGROUND_DELETE_FROM = 256
#: Logs closed at once by :meth:`LogManager.close_async` (their fsyncs run in worker threads).
CLOSE_CONCURRENCY = 8
#: Logs opened (recovered) at once on worker threads at a start, once the opens are found to
#: wait on the device (see OPEN_WAIT_RATIO): their reads and fsyncs then overlap, as the
#: device serves several at once; beyond about this many they queue.
OPEN_THREADS = 8
#: Logs are opened on the calling thread in rounds of this many; after each round, if they
#: waited on the device (OPEN_WAIT_RATIO), the rest go to OPEN_THREADS threads. Fewer logs
#: than this are always opened on the calling thread.
PARALLEL_OPEN_FROM = 64
#: A round of opens whose wall time is more than this many times the calling thread's CPU
#: time, and which slept in the kernel at least once for every two logs (:func:`_blocked`),
#: waited on the device (cold reads, fsyncs of dirty data): the rest are opened on threads.
#: Otherwise they are CPU work under the interpreter lock, which threads only slow down
#: (10,000 logs in the page cache: 2.3 s on the calling thread, 6.5-7.3 s on 8 threads,
#: 4.8 s on 2, on the 2-vCPU reference machine).
OPEN_WAIT_RATIO = 2.0


_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)


def _blocked() -> int | None:
    """How many times the calling thread has slept in the kernel (voluntary context switches:
    a read or an fsync waiting on the device), where the system says (Linux), else ``None``
    (the wall time alone then decides). A thread only preempted (a busy machine) did not
    wait on the device."""
    if _RUSAGE_THREAD is None:
        return None
    return resource.getrusage(_RUSAGE_THREAD).ru_nvcsw


class _RoundStart:
    """The calling thread's clocks at the start of a round of PARALLEL_OPEN_FROM opens."""

    def __init__(self) -> None:
        self.wall, self.cpu, self.blocked = time.perf_counter(), time.thread_time(), _blocked()

    def waited_on_device(self) -> bool:
        """Whether the round since waited on the device (see OPEN_WAIT_RATIO)."""
        cpu = time.thread_time() - self.cpu
        if time.perf_counter() - self.wall <= OPEN_WAIT_RATIO * cpu:
            return False
        blocked = _blocked()
        if self.blocked is None or blocked is None:
            return True
        return blocked - self.blocked >= PARALLEL_OPEN_FROM // 2


#: Every this many checkpoint rounds the logs' flushed offsets are compared with the last
#: checkpoint's even if no flush was counted meanwhile.
CHECKPOINT_FULL_LOOK_EVERY = 10
#: Distinct ``log.json`` contents kept parsed while the logs are opened (a bound: each is
#: a few hundred bytes, and a data directory holds few distinct settings).
MAX_CACHED_CONFIGS = 1024
#: Topic creations made together at most (see :meth:`LogManager.create_topic_async`): their
#: markers and partitions share the threads and the data directory's fsyncs.
CREATE_BATCH = 256
#: Partitions per topic: a bound on directories and open files one request can create.
MAX_PARTITION = 100_000


def validate_topic_name(name: str) -> None:
    """Raise :class:`InvalidConfigError` unless ``name`` is a valid topic name."""
    if not isinstance(name, str) or not name:
        raise InvalidConfigError("topic name must be a non-empty string")
    if len(name) > MAX_TOPIC_NAME:
        raise InvalidConfigError(
            f"topic name of {len(name)} characters exceeds the limit of {MAX_TOPIC_NAME}"
        )
    if name in {".", ".."} or not _TOPIC_RE.fullmatch(name):
        raise InvalidConfigError(
            f"topic name {name!r} may contain only ASCII letters, digits, '.', '_' and '-'"
        )


class LogManager:
    """Opens, creates, flushes, checkpoints, retains and deletes the partition logs of one
    data directory. Owned by one event loop (or one thread when used synchronously).

    Args:
        data_dir: the data directory (created if missing).
        fs: the file system (the real one by default).
        default_config: settings for logs created without their own.
        clock: milliseconds since the epoch (retention, rolling by age).
        checkpoint_interval_ms: how often :meth:`run` rewrites the recovery checkpoint.
        retention_check_interval_ms: how often :meth:`run` applies retention.
        max_open_files: keep at most this many of the logs' files open at once (see
            :mod:`tidewire.storage.filecache`); ``None``: no bound (one descriptor per
            segment).
        preallocate_bytes: zeros written ahead of the appends of a busy ``always`` log
            (``PartitionLog.preallocate_bytes``, set on every log; 0: never).

    Raises:
        InvalidConfigError: ``preallocate_bytes`` is out of range.
    """

    def __init__(
        self,
        data_dir: str,
        *,
        fs: FileSystem | None = None,
        default_config: LogConfig | None = None,
        clock: Clock = wall_clock_ms,
        checkpoint_interval_ms: int = 1000,
        retention_check_interval_ms: int = 60_000,
        max_open_files: int | None = None,
        preallocate_bytes: int = DEFAULT_PREALLOCATE_BYTES,
    ) -> None:
        check_preallocate_bytes(preallocate_bytes)
        #: Set on every log (``PartitionLog.preallocate_bytes``): zeros written ahead of a busy
        #: ``always`` partition's appends.
        self.preallocate_bytes = preallocate_bytes
        self.data_dir = data_dir.rstrip("/") or "/"
        self.fs: FileSystem = fs or OsFileSystem()
        if max_open_files is not None:
            self.fs = CachedFileSystem(self.fs, max_open_files)
        self.default_config = default_config or LogConfig()
        self.clock = clock
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.retention_check_interval_ms = retention_check_interval_ms
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        #: Partitions that could not be opened (an unreadable ``log.json``), with the reason:
        #: offline, while every other log serves.
        self.offline: dict[tuple[str, int], str] = {}
        #: The recovery points of offline partitions, kept in the checkpoint as they were.
        self._offline_points: dict[str, int] = {}
        #: ``log.json`` contents -> their settings, while opening (see _read_config).
        self._configs: dict[bytes, LogConfig] = {}
        #: topic -> its partitions: answers "which partitions" without scanning every log.
        self._parts: dict[str, set[int]] = {}
        #: Topics whose partitions are being created or deleted on a worker thread: no other
        #: creation or deletion of them may start meanwhile.
        self._busy: set[str] = set()
        #: Background removals of deleted topics' files, each resolved when it ends.
        self._removals: set[asyncio.Future[None]] = set()
        #: Creations waiting for the one running (made together once it ends), and its task.
        self._to_create: list[tuple[Creation, asyncio.Future[list[PartitionLog]]]] = []
        self._creator: asyncio.Task[None] | None = None
        self.was_clean = False
        #: How the last :meth:`open` found the directory: "new" (nothing in it), "clean"
        #: (after a clean shutdown) or "unclean" (the logs' tails were scanned).
        self.last_start = "new"
        self._opened = False
        self._closed = False
        self._dir_lock: FileLock | None = None
        self._last_flush: dict[tuple[str, int], float] = {}
        #: Logs appended to since the manager last found them flushed: the only ones
        #: :meth:`flush_due` looks at, so an idle broker's cost does not grow with its
        #: partitions. Set when :meth:`run` should look again before its next deadline.
        self._unflushed: set[tuple[str, int]] = set()
        self._wake: asyncio.Event | None = None
        self._checkpoint_last: bytes = b""
        #: Bumped whenever a log is added or dropped; with every log's flushed offset, what
        #: the checkpoint last written was made from: unchanged, no snapshot is taken (a
        #: snapshot of 10,000 logs, sorted and encoded, costs ~20 ms of the loop every second).
        self._generation = 0
        self._checkpoint_state: tuple[int, list[int]] | None = None
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_taken = 0  # generation of the last snapshot taken
        self._checkpoint_written = 0  # generation of the snapshot on disk
        #: Group commits of every log here (for metrics), and how long :meth:`open` took.
        self.flush_stats = FlushStats()
        self.open_seconds = 0.0

    # --- opening --------------------------------------------------------------------------------

    def open(self) -> LogManager:
        """Open every partition log in the data directory, recovering as needed.

        Returns:
            ``self``.

        Raises:
            DataDirLockedError: another broker has the directory open.
            StorageError: the directory or a log cannot be read.
        """
        fs, d = self.fs, self.data_dir
        started = time.monotonic()
        self._lock_dir()
        try:
            names = [n for n in fs.listdir(d) if n != LOCK_FILE]
            self.was_clean = CLEAN_SHUTDOWN_FILE in names
            points = self._read_recovery_points() if RECOVERY_CHECKPOINT_FILE in names else {}
            names = remove_half_created(fs, d, names)
            found: list[tuple[str, int, str]] = []
            for name in names:
                if name.endswith("-delete"):
                    fs.rmtree(f"{d}/{name}")
                    continue
                m = _PARTITION_DIR_RE.match(name)
                if m is not None:
                    found.append((m.group(1), int(m.group(2)), name))
            for (topic, partition, name), opened in zip(
                found, self._open_logs(found, points), strict=True
            ):
                if isinstance(opened, StorageError):  # an unreadable log.json
                    self.offline[(topic, partition)] = opened.message
                    if name in points:
                        self._offline_points[name] = points[name]
                    log.error(
                        "partition %s-%d is offline: %s; the other partitions serve",
                        topic,
                        partition,
                        opened.message,
                    )
                    continue
                self._register(topic, [opened], range(partition, partition + 1))
            if self.was_clean:
                fs.remove(f"{d}/{CLEAN_SHUTDOWN_FILE}")
            fs.sync_dir(d)
        except BaseException as exc:
            for plog in self.logs.values():
                plog.abandon()
            self._unlock_dir()
            if isinstance(exc, OSError | StorageError):  # StorageError: a log failed to open
                raise StorageError(f"cannot open data directory {d}: {exc}") from exc
            raise
        self._configs.clear()
        self._opened = True
        self.open_seconds = time.monotonic() - started
        self.last_start = "new" if not names else ("clean" if self.was_clean else "unclean")
        if not names:
            how = "a new data directory"
        else:
            how = "after a clean shutdown" if self.was_clean else "after an unclean stop"
        log.info("opened %s (%s): %d log(s)", d, how, len(self.logs))
        return self

    def _open_logs(
        self, found: list[tuple[str, int, str]], points: dict[str, int]
    ) -> list[PartitionLog | StorageError]:
        """Open the logs ``found`` (topic, partition, directory name), in order: on the
        calling thread while that is mostly CPU work, on OPEN_THREADS threads from the first
        round of PARALLEL_OPEN_FROM that waited on the device (OPEN_WAIT_RATIO), whose reads
        and fsyncs then overlap. Each result is the open log, or the error that makes its
        partition offline (an unreadable ``log.json``).

        Raises:
            StorageError, OSError: the first log that failed otherwise, once every open has
                ended (the logs opened meanwhile are abandoned).
        """
        d = self.data_dir

        def one(name: str) -> PartitionLog | StorageError:
            try:
                config = self._read_config(f"{d}/{name}")
            except StorageError as exc:
                return exc
            return PartitionLog.open(
                self.fs,
                f"{d}/{name}",
                config,
                clean=self.was_clean,
                recovery_point=points.get(name, 0),
                clock=self.clock,
            )

        out: list[PartitionLog | StorageError] = []
        try:
            for start in range(0, len(found), PARALLEL_OPEN_FROM):
                round_start = _RoundStart()
                for _, _, name in found[start : start + PARALLEL_OPEN_FROM]:
                    out.append(one(name))
                rest = found[start + PARALLEL_OPEN_FROM :]
                if rest and round_start.waited_on_device():
                    log.info(
                        "opening the other %d logs on %d threads: the first %d waited on the "
                        "device",
                        len(rest),
                        OPEN_THREADS,
                        len(out),
                    )
                    out.extend(self._open_on_threads(one, [name for _, _, name in rest]))
                    break
        except BaseException:
            for opened in out:
                if isinstance(opened, PartitionLog):
                    opened.abandon()
            raise
        return out

    @staticmethod
    def _open_on_threads(
        one: Callable[[str], PartitionLog | StorageError], names: list[str]
    ) -> list[PartitionLog | StorageError]:
        """``one`` of each of ``names`` on OPEN_THREADS threads, in order.

        Raises:
            StorageError, OSError: the first open that failed, once every open has ended (the
                logs opened meanwhile are abandoned).
        """
        with concurrent.futures.ThreadPoolExecutor(
            OPEN_THREADS, thread_name_prefix="tidewire-open"
        ) as pool:
            futures = [pool.submit(one, name) for name in names]
            concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
            for fut in futures:  # after a failure, the opens not started yet are not needed
                fut.cancel()
        failed = next(
            (f.exception() for f in futures if not f.cancelled() and f.exception() is not None),
            None,
        )
        if failed is not None:
            for fut in futures:
                if not fut.cancelled() and fut.exception() is None:
                    opened = fut.result()
                    if isinstance(opened, PartitionLog):
                        opened.abandon()
            raise failed
        return [f.result() for f in futures]

    def _lock_dir(self) -> None:
        """Create the directory and take its lock, or refuse naming who holds it."""
        d = self.data_dir
        path = f"{d}/{LOCK_FILE}"
        try:
            self.fs.makedirs(d)
            self._dir_lock = self.fs.try_lock(path, f"{os.getpid()}\n".encode())
        except LockHeldError as exc:
            pid = exc.holder.decode("ascii", "replace").strip()
            if not pid.isdigit():
                who = "another broker (its pid is not recorded yet)"
            elif int(pid) == os.getpid():
                who = f"another broker in this process (pid {pid})"
            else:
                who = f"another broker, pid {pid}"
            raise DataDirLockedError(
                f"data directory {d} is in use by {who}, which holds the lock {path}: stop "
                "it first, or give this broker another data directory"
            ) from None
        except OSError as exc:
            raise StorageError(f"cannot lock data directory {d} ({path}): {exc}") from exc

    def _unlock_dir(self) -> None:
        lock, self._dir_lock = self._dir_lock, None
        if lock is not None:
            lock.release()

    def _read_recovery_points(self) -> dict[str, int]:
        path = f"{self.data_dir}/{RECOVERY_CHECKPOINT_FILE}"
        try:
            data = json.loads(self.fs.read_file(path))
            points = data["logs"]
            if data.get("version") != 1 or not isinstance(points, dict):
                raise ValueError("unknown layout")
            return {str(k): int(v) for k, v in points.items()}
        except (ValueError, KeyError, TypeError) as exc:
            # A checkpoint only speeds up recovery; without it every tail is scanned.
            log.warning("ignoring unreadable %s: %s", path, exc)
            return {}

    def _read_config(self, directory: str) -> LogConfig:
        path = f"{directory}/{LOG_CONFIG_FILE}"
        try:
            raw = self.fs.read_file(path)
        except FileNotFoundError:
            return self.default_config
        # Most logs share a few settings: parsed once each (a tenth of a restart's CPU).
        config = self._configs.get(raw)
        if config is not None:
            return config
        try:
            config = LogConfig.from_dict(json.loads(raw))
        except (ValueError, TypeError, AttributeError, InvalidConfigError) as exc:
            raise StorageError(f"log configuration {path} is unreadable: {exc}") from exc
        if len(self._configs) >= MAX_CACHED_CONFIGS:
            self._configs.clear()
        self._configs[raw] = config
        return config

    # --- logs -----------------------------------------------------------------------------------

    def create_log(
        self, topic: str, partition: int, config: LogConfig | None = None
    ) -> PartitionLog:
        """Create the log of ``topic``/``partition``.

        Raises:
            InvalidConfigError: a bad topic name or partition number.
            LogExistsError: it exists.
            StorageError: the directory or its files cannot be created.
        """
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise InvalidConfigError(f"partition must be an integer, got {partition!r}")
        if not 0 <= partition < MAX_PARTITION:
            raise InvalidConfigError(f"partition {partition} must be within 0..{MAX_PARTITION - 1}")
        return self.create_topic(topic, range(partition, partition + 1), config)[0]

    def _register(self, topic: str, logs: list[PartitionLog], partitions: range) -> None:
        self._generation += 1
        parts = self._parts.setdefault(topic, set())
        for p, plog in zip(partitions, logs, strict=True):
            plog.on_truncate = self._after_truncate
            plog.preallocate_bytes = self.preallocate_bytes
            plog.flush_stats = self.flush_stats
            plog.on_unflushed = functools.partial(self._mark_unflushed, (topic, p))
            if plog.flushed_offset < plog.log_end_offset:
                self._mark_unflushed((topic, p))
            self.logs[(topic, p)] = plog
            parts.add(p)

    def _check_new_partitions(self, topic: str, partitions: range) -> None:
        """Raise unless ``partitions`` of ``topic`` may be created now."""
        self._check_open()
        validate_topic_name(topic)
        if not 0 <= partitions.start < partitions.stop <= MAX_PARTITION:
            raise InvalidConfigError(
                f"partitions {partitions.start}..{partitions.stop - 1} must be within "
                f"0..{MAX_PARTITION - 1}"
            )
        if topic in self._busy:
            raise LogExistsError(
                f"topic {topic!r} is being created or deleted; try again once that is done"
            )
        taken = self._parts.get(topic, set()).intersection(partitions)
        taken.update(p for t, p in self.offline if t == topic and p in partitions)
        if taken:
            raise LogExistsError(f"log {topic}-{min(taken)} exists already")

    def create_topic(
        self, topic: str, partitions: range, config: LogConfig | None = None
    ) -> list[PartitionLog]:
        """Create the logs of ``partitions`` of ``topic``, all or none (see
        :mod:`tidewire.storage.creation`), on this thread. :meth:`create_topic_async` does the
        file work on a worker thread.

        Returns:
            The new logs, in partition order.

        Raises:
            InvalidConfigError: a bad topic name or partition range.
            LogExistsError: one of the logs exists, or the topic is being created or deleted.
            StorageError: a file operation failed; none of the logs was created.
        """
        self._check_new_partitions(topic, partitions)
        cfg = config or self.default_config
        logs = self._create_files(topic, partitions, cfg)
        self._register(topic, logs, partitions)
        return logs

    async def create_topic_async(
        self, topic: str, partitions: range, config: LogConfig | None = None
    ) -> list[PartitionLog]:
        """:meth:`create_topic` with the file work on worker threads, so the event loop goes
        on serving meanwhile; the topic is registered, on the loop, once all its logs exist.
        Creations requested while others run are made together, each all or none, sharing
        the data directory's fsyncs (see :func:`~tidewire.storage.creation.create_many`).
        (A cancelled caller does not undo the creation: it is registered all the same.)

        Raises:
            What :meth:`create_topic` raises.
        """
        self._check_new_partitions(topic, partitions)
        cfg = config or self.default_config
        self._busy.add(topic)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[PartitionLog]] = loop.create_future()
        # Retrieved here so that a cancelled caller's failure is not reported as unhandled.
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._to_create.append((Creation(topic, partitions, cfg, _config_json(cfg)), fut))
        if self._creator is None:
            self._creator = loop.create_task(self._create_queued(), name="topic creation")
            self._creator.add_done_callback(_log_creator_failure)
        return await asyncio.shield(fut)

    async def _create_queued(self) -> None:
        """Create the queued topics, up to CREATE_BATCH at a time, until none is left."""
        loop = asyncio.get_running_loop()
        try:
            while self._to_create:
                batch = self._to_create[:CREATE_BATCH]
                del self._to_create[:CREATE_BATCH]
                try:
                    results = await loop.run_in_executor(
                        None,
                        functools.partial(
                            create_many,
                            self.fs,
                            self.data_dir,
                            [c for c, _ in batch],
                            clock=self.clock,
                            config_file=LOG_CONFIG_FILE,
                        ),
                    )
                except BaseException as exc:  # not a creation's failure: a bug or a stop
                    for c, fut in batch:
                        self._busy.discard(c.topic)
                        if fut.done():
                            continue
                        if isinstance(exc, asyncio.CancelledError):
                            fut.cancel()
                        else:
                            fut.set_exception(_creation_error(c, exc))
                    raise
                for (c, fut), result in zip(batch, results, strict=True):
                    self._busy.discard(c.topic)
                    if isinstance(result, BaseException):
                        fut.set_exception(_creation_error(c, result))
                        continue
                    if self._closed:  # the manager closed meanwhile: nothing would close these
                        for plog in result:
                            plog.close()
                    else:
                        self._register(c.topic, result, c.partitions)
                    fut.set_result(result)
        finally:
            self._creator = None

    def _create_files(self, topic: str, partitions: range, cfg: LogConfig) -> list[PartitionLog]:
        try:
            return create_partitions(
                self.fs,
                self.data_dir,
                topic,
                partitions,
                cfg,
                config_json=_config_json(cfg),
                clock=self.clock,
                config_file=LOG_CONFIG_FILE,
            )
        except (OSError, StorageError) as exc:
            raise _creation_error(Creation(topic, partitions, cfg, b""), exc) from exc

    def get_log(self, topic: str, partition: int) -> PartitionLog:
        """Return the log of ``topic``/``partition``.

        Raises:
            LogNotFoundError: there is none.
        """
        plog = self.logs.get((topic, partition))
        if plog is None:
            raise LogNotFoundError(f"no log for topic {topic!r} partition {partition}")
        return plog

    def topics(self) -> dict[str, list[int]]:
        """Topic name -> sorted partition numbers."""
        if not self.offline:
            return {t: sorted(parts) for t, parts in sorted(self._parts.items())}
        out: dict[str, set[int]] = {t: set(parts) for t, parts in self._parts.items()}
        for topic, partition in self.offline:  # offline partitions are the topic's too
            out.setdefault(topic, set()).add(partition)
        return {t: sorted(parts) for t, parts in sorted(out.items())}

    def topic_names(self) -> list[str]:
        """Every topic's name, sorted."""
        if not self.offline:
            return sorted(self._parts)
        return sorted(set(self._parts).union(t for t, _ in self.offline))

    def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has (0: no such topic), without scanning the logs
        (offline partitions included: they are rare)."""
        parts = self._parts.get(topic)
        n = len(parts) if parts is not None else 0
        if self.offline:
            n += sum(1 for t, _ in self.offline if t == topic)
        return n

    def set_config(self, topic: str, partition: int, config: LogConfig) -> None:
        """Change a log's settings (persisted atomically; effective at once)."""
        plog = self.get_log(topic, partition)
        try:
            write_atomic(self.fs, f"{plog.directory}/{LOG_CONFIG_FILE}", _config_json(config))
        except OSError as exc:
            raise StorageError(f"cannot write {plog.directory}/{LOG_CONFIG_FILE}: {exc}") from exc
        plog.config = config
        if plog.flushed_offset < plog.log_end_offset:  # e.g. now under the interval policy
            self._mark_unflushed((topic, partition))

    def delete_topic(self, topic: str) -> list[int]:
        """Delete every partition log of ``topic``: each directory is renamed atomically to a
        ``-delete`` name (so a crash cannot leave half a log), then removed.

        Returns:
            The partitions deleted.

        Raises:
            LogNotFoundError: the topic has no logs.
            StorageError: a rename or removal failed.
        """
        parts, directories = self.detach_topic(topic)
        self._remove_files(topic, directories)
        return parts

    async def delete_topic_async(self, topic: str) -> list[int]:
        """:meth:`delete_topic` with the file work on a worker thread: the topic is gone for
        readers and writers at once; its name can be used again once its files are gone.

        Raises:
            What :meth:`delete_topic` raises.
        """
        parts, directories = self.detach_topic(topic)
        await self.remove_files_async(topic, directories)
        return parts

    async def remove_files_async(self, topic: str, directories: list[str]) -> None:
        """Remove the directories :meth:`detach_topic` returned, on a worker thread; the
        topic's name cannot be used again until they are gone.

        Raises:
            StorageError: a rename or removal failed.
        """
        self._busy.add(topic)
        loop = asyncio.get_running_loop()
        if len(directories) <= BACKGROUND_DELETE_FROM:
            fut = loop.run_in_executor(None, self._remove_files, topic, directories)
            fut.add_done_callback(lambda _: self._busy.discard(topic))
            await asyncio.shield(fut)
            return
        # Many directories take long to remove (seconds on a busy disk): once the marker is
        # durable the deletion is done; the files go in the background, and the name is free
        # again once they are gone.
        try:
            marker = await asyncio.shield(
                loop.run_in_executor(
                    None, mark_deleting, self.fs, self.data_dir, topic, directories
                )
            )
        except OSError:
            fut = loop.run_in_executor(None, self._remove_files, topic, directories)
            fut.add_done_callback(lambda _: self._busy.discard(topic))
            await asyncio.shield(fut)
            return
        done = loop.create_future()
        self._removals.add(done)

        def finished(ok: bool) -> None:
            self._removals.discard(done)
            if ok:  # else the name stays taken: the next open finishes the removal
                self._busy.discard(topic)
            if not done.done():
                done.set_result(None)

        def remove() -> None:
            ok = True
            try:
                finish_deleting(self.fs, self.data_dir, marker, directories)
            except OSError as exc:
                ok = False
                log.error(
                    "removing the files of deleted topic %r failed: %s; the next start "
                    "removes them (until then its name cannot be used again)",
                    topic,
                    exc,
                )
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to tell
                loop.call_soon_threadsafe(finished, ok)

        # A daemon thread: a stop does not wait for it (the next open finishes its work).
        threading.Thread(target=remove, name=f"tidewire-delete-{topic}", daemon=True).start()

    async def wait_removals(self) -> None:
        """Return once the files of every topic deleted so far are removed (or failed to be)."""
        while self._removals:
            await asyncio.wait(list(self._removals))

    def detach_topic(self, topic: str) -> tuple[list[int], list[str]]:
        """The first half of a deletion, on the owner thread: forget ``topic``'s logs and close
        them (without a flush: their data is being deleted). Returns its partitions and their
        directories, for :meth:`remove_files_async`.

        Raises:
            LogNotFoundError: the topic has no logs.
            LogExistsError: it is being created or deleted.
        """
        self._check_open()
        if topic in self._busy:
            raise LogExistsError(
                f"topic {topic!r} is being created or deleted; try again once that is done"
            )
        parts = sorted(self._parts.pop(topic, ()))
        offline = sorted(p for t, p in self.offline if t == topic)
        if not parts and not offline:
            raise LogNotFoundError(f"no logs for topic {topic!r}")
        self._generation += 1
        directories: list[str] = []
        for p in parts:
            plog = self.logs.pop((topic, p))
            self._last_flush.pop((topic, p), None)
            plog.abandon()
            directories.append(plog.directory)
        for p in offline:  # never opened: only their directories to remove
            del self.offline[(topic, p)]
            directories.append(f"{self.data_dir}/{topic}-{p}")
        return sorted([*parts, *offline]), directories

    async def delete_partition_async(self, topic: str, partition: int) -> None:
        """Delete one partition log of ``topic`` (a replica moved to other nodes): forgotten
        at once, its directory renamed to a ``-delete`` name and removed on a worker thread.
        Nothing happens when it is not here.

        Raises:
            LogExistsError: the topic is being created or deleted.
            StorageError: a rename or removal failed.
        """
        self._check_open()
        if topic in self._busy:
            raise LogExistsError(
                f"topic {topic!r} is being created or deleted; try again once that is done"
            )
        key = (topic, partition)
        if key in self.offline:
            del self.offline[key]
            directory = f"{self.data_dir}/{topic}-{partition}"
        else:
            plog = self.logs.pop(key, None)
            if plog is None:
                return
            parts = self._parts.get(topic, set())
            parts.discard(partition)
            if not parts:
                self._parts.pop(topic, None)
            self._last_flush.pop(key, None)
            self._unflushed.discard(key)
            # What waited on this replica was never acknowledged here, and its partition now
            # lives elsewhere: the producers retry with the new leader (Kafka's
            # NOT_LEADER_OR_FOLLOWER), which keeps what it copied once (idempotence).
            plog.abandon(
                NotLeaderError(f"{topic}-{partition} moved to other nodes; ask the metadata")
            )
            directory = plog.directory
        self._generation += 1
        await asyncio.to_thread(self._remove_files, topic, [directory])

    def _remove_files(self, topic: str, directories: list[str]) -> None:
        doomed: list[str] = []
        try:
            for directory in directories:
                gone = f"{directory}.{uuid.uuid4().hex}-delete"
                self.fs.rename(directory, gone)
                doomed.append(gone)
            self.fs.sync_dir(self.data_dir)
            for path in doomed:
                self.fs.rmtree(path)
        except OSError as exc:
            raise StorageError(f"deleting topic {topic!r} failed: {exc}") from exc

    def _check_open(self) -> None:
        if not self._opened or self._closed:
            raise StorageError(f"log manager of {self.data_dir} is not open")

    # --- background work ------------------------------------------------------------------------

    def _mark_unflushed(self, key: tuple[str, int]) -> None:
        self._unflushed.add(key)
        if self._wake is not None:
            self._wake.set()

    def _settled(self, key: tuple[str, int], plog: PartitionLog | None) -> bool:
        """Whether ``key`` has nothing left for :meth:`flush_due`; if so it leaves the
        unflushed set (its next append puts it back)."""
        if plog is None or plog.failed is not None or plog.config.fsync is not FsyncPolicy.INTERVAL:
            pass  # gone, failed, or flushed by its own policy: nothing for the manager to do
        elif plog.flushed_offset < plog.log_end_offset:
            return False
        self._unflushed.discard(key)
        if plog is not None:
            plog.unflushed_marked = False
        return True

    async def flush_due(self, now_monotonic: float | None = None) -> int:
        """Flush every ``interval`` log whose ``flush_interval_ms`` has passed since its last
        flush and that has unflushed data. Returns how many were flushed.

        Only the logs appended to since they were last found flushed are looked at."""
        now = time.monotonic() if now_monotonic is None else now_monotonic
        due: list[PartitionLog] = []
        keys: list[tuple[str, int]] = []
        for key in list(self._unflushed):
            plog = self.logs.get(key)
            if self._settled(key, plog):
                continue
            assert plog is not None
            last = self._last_flush.setdefault(key, now)
            if now - last >= plog.config.flush_interval_ms / 1000:
                self._last_flush[key] = now
                due.append(plog)
                keys.append(key)
        results = await asyncio.gather(*(p.flush_async() for p in due), return_exceptions=True)
        for plog, res in zip(due, results, strict=True):
            if isinstance(res, TidewireError):
                log.error("interval flush of %s failed: %s", plog.directory, res)
            elif isinstance(res, BaseException):
                raise res
        for key in keys:  # appends made while flushing keep their log in the set
            self._settled(key, self.logs.get(key))
        return len(due)

    def _next_flush_in(self, now: float) -> float | None:
        """Seconds until the earliest interval flush is due (None: none is pending)."""
        soonest: float | None = None
        for key in self._unflushed:
            plog = self.logs.get(key)
            if plog is None:
                return 0.0  # let flush_due drop it
            last = self._last_flush.get(key, now)
            wait = last + plog.config.flush_interval_ms / 1000 - now
            soonest = wait if soonest is None else min(soonest, wait)
        return soonest

    def write_recovery_checkpoint(self) -> None:
        """Record every log's flushed offset (atomically)."""
        self._write_checkpoint(*self._checkpoint_snapshot())
        self._checkpoint_last = b""  # the periodic write compares with what it wrote last
        self._checkpoint_state = None

    def _after_truncate(self, plog: PartitionLog) -> None:
        # Truncation is rare: rewrite the checkpoint at once (as Kafka does) so its recovery
        # point never stays above the log's end.
        self.write_recovery_checkpoint()

    def _checkpoint_snapshot(self) -> tuple[bytes, int]:
        """On the loop: the checkpoint's contents now, and their generation."""
        points = {f"{t}-{p}": plog.flushed_offset for (t, p), plog in sorted(self.logs.items())}
        if self._offline_points:
            points.update(
                (name, point)
                for name, point in self._offline_points.items()
                if _key(name) in self.offline
            )
        self._checkpoint_taken += 1
        data = json.dumps({"version": 1, "logs": points}, sort_keys=True).encode()
        return data, self._checkpoint_taken

    def _write_checkpoint(self, data: bytes, generation: int) -> None:
        """Write a snapshot unless a newer one is on disk already: a periodic write that was
        overtaken (by the one a truncation makes at once) must not bring back older points.
        Serialised, since the periodic writes run in a worker thread."""
        with self._checkpoint_lock:
            if generation <= self._checkpoint_written:
                return
            write_atomic(self.fs, f"{self.data_dir}/{RECOVERY_CHECKPOINT_FILE}", data)
            self._checkpoint_written = generation

    async def _checkpoint_if_changed(self) -> bool:
        """Write the recovery checkpoint if a log was added or dropped or a flushed offset
        moved since the last one; return whether the one on disk is up to date."""
        state = (self._generation, [plog.flushed_offset for plog in self.logs.values()])
        if state == self._checkpoint_state:
            return True
        data, generation = self._checkpoint_snapshot()
        if data != self._checkpoint_last:  # unchanged points need no rewrite
            try:
                # Snapshot on the loop, write in a thread: the loop owns the logs.
                await asyncio.to_thread(self._write_checkpoint, data, generation)
            except OSError as exc:
                log.error("writing the recovery checkpoint failed: %s", exc)
                return False
            self._checkpoint_last = data
        self._checkpoint_state = state
        return True

    def apply_retention(self, now_ms: int | None = None) -> dict[tuple[str, int], list[int]]:
        """Apply every log's retention. Returns the deleted segment bases per log."""
        out: dict[tuple[str, int], list[int]] = {}
        for key, plog in self.logs.items():
            try:
                deleted = plog.apply_retention(now_ms)
            except TidewireError as exc:
                log.error("retention of %s failed: %s", plog.directory, exc)
                continue
            if deleted:
                out[key] = deleted
        return out

    async def run(self, *, tick_ms: int = 10) -> None:
        """Run the background work until cancelled: interval flushes, the recovery
        checkpoint, retention. Start it under a TaskGroup or keep a reference to its task.

        It sleeps until the next thing is due: the earliest interval flush of a log with
        unflushed data (at most every ``tick_ms``), the checkpoint, retention. An append to a
        log with nothing pending wakes it, so an idle broker costs nothing per partition."""
        self._wake = wake = asyncio.Event()
        last_checkpoint = last_retention = time.monotonic()
        rounds = 0
        seen_flushes: tuple[int, int] | None = None
        while True:
            now = time.monotonic()
            until = min(
                last_checkpoint + self.checkpoint_interval_ms / 1000,
                last_retention + self.retention_check_interval_ms / 1000,
            )
            flush_in = self._next_flush_in(now)
            if flush_in is not None:
                until = min(until, now + max(flush_in, tick_ms / 1000))
            wake.clear()
            if until > now:
                if flush_in is None:  # an append may make a flush due sooner
                    await wait_event(wake, until - now)
                else:
                    await asyncio.sleep(until - now)
            now = time.monotonic()
            await self.flush_due(now)
            if (now - last_checkpoint) * 1000 >= self.checkpoint_interval_ms:
                last_checkpoint = now
                rounds += 1
                # Flushed offsets move by flushes, which the logs count in flush_stats (but
                # for a blocking flush(), which a full look every few rounds catches; a
                # truncation rewrites the checkpoint itself): no flush, no look at the logs.
                flushes = (self._generation, self.flush_stats.count)
                look = flushes != seen_flushes or not rounds % CHECKPOINT_FULL_LOOK_EVERY
                if look and await self._checkpoint_if_changed():
                    seen_flushes = flushes
            if (now - last_retention) * 1000 >= self.retention_check_interval_ms:
                last_retention = now
                self.apply_retention()

    # --- closing --------------------------------------------------------------------------------

    async def close_async(self) -> None:
        """Flush and close every log, write the recovery checkpoint and the clean-shutdown
        marker (the marker only if every log closed cleanly).

        Raises:
            StorageError: a log failed to flush; no clean-shutdown marker is written.
        """
        if self._closed or not self._opened:
            return
        errors: list[TidewireError] = []
        # Each log right after it goes idle, CLOSE_CONCURRENCY at once: their final fsyncs and
        # index writes run in worker threads, and a device takes them in parallel.
        slots = asyncio.Semaphore(CLOSE_CONCURRENCY)

        async def close_one(plog: PartitionLog) -> None:
            async with slots:
                try:
                    await plog.close_async()
                except TidewireError as exc:  # reported once for every log, by _finish_close
                    errors.append(exc)

        await asyncio.gather(*(close_one(plog) for plog in list(self.logs.values())))
        self._finish_close(errors)

    def close(self) -> None:
        """Synchronous :meth:`close_async`, for use without an event loop.

        Raises:
            StorageError: a log failed to flush; no clean-shutdown marker is written.
        """
        if self._closed or not self._opened:
            return
        errors: list[TidewireError] = []
        for plog in self.logs.values():
            try:
                plog.close()
            except TidewireError as exc:  # reported once for every log, by _finish_close
                errors.append(exc)
            except RuntimeError as exc:  # a flush is running
                errors.append(StorageError(f"closing {plog.directory}: {exc}"))
        self._finish_close(errors)

    def abandon(self) -> None:
        """Drop every log and the directory's lock without flushing or writing anything: what
        a killed process leaves behind (for crash tests, and for giving up after a failure)."""
        for plog in self.logs.values():
            plog.abandon()
        self._closed = True
        self._unlock_dir()

    def _finish_close(self, errors: list[TidewireError]) -> None:
        """Write the checkpoint and, if every log closed cleanly, the clean-shutdown marker;
        then release the directory's lock.

        Raises:
            StorageError: one for all: how many logs could not be flushed and the first one's
                cause (a full disk: ``No space left on device (ENOSPC)``), or the checkpoint
                or marker that could not be written.
        """
        failed_before = sum(1 for p in self.logs.values() if p.failed is not None) - len(errors)
        corrupt = sum(1 for p in self.logs.values() if p.corruption is not None)
        # An offline partition was not opened, so not recovered: its next open must not
        # trust its files as a clean shutdown would. Nor does a log with damage it still
        # refuses: its next open verifies more.
        clean = not errors and failed_before <= 0 and not corrupt and not self.offline
        self._closed = True
        try:
            self.write_recovery_checkpoint()
            if clean:
                write_atomic(self.fs, f"{self.data_dir}/{CLEAN_SHUTDOWN_FILE}", b"{}\n")
        except OSError as exc:
            if not errors:
                raise StorageError(
                    f"closing {self.data_dir} failed: {describe_os_error(exc)}: "
                    f"{exc.filename}; the next start recovers every log"
                ) from exc
        finally:
            self._unlock_dir()  # last: the next owner may open the directory from here on
        if errors:
            raise StorageError(
                f"closing {self.data_dir}: {len(errors)} of {len(self.logs)} log(s) could not "
                "be flushed, so the clean-shutdown marker is not written and the next start "
                f"recovers them; the first: {errors[0].message}"
            )
        if not clean:
            log.warning(
                "closed %s without the clean-shutdown marker (%d log(s) failed earlier, %d "
                "corrupt): the next start recovers them",
                self.data_dir,
                max(failed_before, 0),
                corrupt,
            )

    async def __aenter__(self) -> LogManager:
        if not self._opened:
            self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close_async()


def _key(name: str) -> tuple[str, int]:
    """``TOPIC-P`` -> (TOPIC, P)."""
    topic, _, partition = name.rpartition("-")
    return topic, int(partition)


def _log_creator_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("topic creation failed", exc_info=task.exception())


def _creation_error(c: Creation, exc: BaseException) -> BaseException:
    """The error a failed creation reports: a StorageError naming the partitions for a file
    system's failure; anything else as it is."""
    first, last = c.partitions.start, c.partitions.stop - 1
    what = f"partition {first}" if first == last else f"partitions {first}..{last}"
    if isinstance(exc, StorageError):
        why = exc.message
    elif isinstance(exc, OSError):
        why = str(exc)
    else:
        return exc
    err = StorageError(
        f"cannot create {what} of topic {c.topic!r}: {why}; none of them was created"
    )
    err.__cause__ = exc
    return err


def _config_json(cfg: LogConfig) -> bytes:
    return json.dumps(cfg.to_dict(), sort_keys=True, indent=2).encode() + b"\n"
