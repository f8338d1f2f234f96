"""Creating a topic's partition logs all or none.

A topic of N partitions is N directories, and no file system renames N directories at once.
So a creation is bracketed by a marker file in the data directory, ``TOPIC.creating``
(JSON ``{"version": 1, "topic": ..., "first": P, "count": N}``), written durably before the
first partition directory and removed, durably, after the last one is durable:

1. write the marker (temp, fsync, rename, fsync the data directory);
2. for each partition: make ``TOPIC-P/``, write and fsync its ``log.json``, create its first
   segment and fsync the partition directory (from :data:`PARALLEL_FROM` partitions these run
   on a few threads at once: the fsyncs are the cost, and the device takes them in parallel;
   where one sync of the whole file system replaces them, below, the partitions are made one
   after the other on the calling thread);
3. fsync the data directory (every ``TOPIC-P`` entry is durable), remove the marker, fsync
   the data directory again.

Several creations can be made at once (:func:`create_many`, which the log manager uses for
creations requested while another runs): each stays all or none, and they share one marker,
``creations+HEX.creating`` (JSON ``{"version": 2, "creations": [{"topic": ..., "first": P,
"count": N}, ...]}``; ``+`` is in no topic's name, so it is no topic's marker), and the three
fsyncs of the data directory. One marker for the lot rather than one a topic: 10,000 topics of
one partition cost two fsyncs and two new files each (``log.json``, the segment) rather than
three and three. Creations made together, and a lone queued creation of
:data:`WHOLE_SYNC_PARTITIONS` partitions or more, are made durable by one sync of the whole
file system instead of those fsyncs (:func:`create_many`).

A creation of the lot that fails is undone before the marker goes; if its removal fails too,
the marker is rewritten to name only what is left of it, and a later creation of the same
partitions takes them out of it first (else the next start would remove the new topic with
the leftovers).

A failure at any step removes what was made and the marker, and reports the first error; a
crash leaves the marker, and :func:`remove_half_created` (called when the data directory is
opened) removes the partitions it names. Adding partitions to a topic works the same way with
``first`` the first new partition, so a failed addition leaves the old ones alone.

Deleting a large topic works the other way round: a marker ``TOPIC.deleting`` (JSON
``{"version": 1, "topic": ..., "directories": [...]}``) is written durably, the deletion is then
done as far as anyone can tell, and the directories are removed in the background
(:func:`finish_deleting`); the next open finishes a removal a stop interrupted.

A marker's name cannot be a partition directory's (those end in ``-`` and digits).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tidewire.storage.config import LogConfig
from tidewire.storage.fs import FileSystem, WholeSync, write_atomic
from tidewire.storage.log import Clock, PartitionLog

__all__ = [
    "CREATING_SUFFIX",
    "DELETING_SUFFIX",
    "Creation",
    "create_many",
    "create_partitions",
    "finish_deleting",
    "mark_deleting",
    "remove_half_created",
]

log = logging.getLogger("tidewire.storage")
T = TypeVar("T")

CREATING_SUFFIX = ".creating"
DELETING_SUFFIX = ".deleting"
#: Partitions synced file by file are created on worker threads at once: each costs two
#: fsyncs (its log.json and its directory), which the file system's journal commits together
#: when many wait at once (2,000 partitions on the shared reference disk: 278 a second on 8
#: threads, 469 on 32, medians of 3 side by side).
CREATE_THREADS = 32
#: Fewer partitions than this are created on the calling thread (no pool to start).
PARALLEL_FROM = 16
#: From this many creations made together (the log manager's batch of queued creations), one
#: sync of the whole file system (``syncfs``) makes their partitions durable rather than an
#: fsync of each partition's ``log.json`` and of its directory (10,000 topics of one partition
#: through ``tidewire serve``, 50 requests in flight: 416 -> 613 topics/s, medians of 4 side by
#: side).
WHOLE_SYNC_FROM = 2
#: A lone creation of this many partitions or more, made on a worker thread (the log manager's
#: queued creations), is made durable by one sync of the whole file system too; a smaller one
#: keeps its few fsyncs, which wait for nothing but its own files (a ``syncfs`` writes back
#: whatever else of the file system is dirty, for as long as that takes). A creation its
#: caller waits for (:func:`create_partitions`: ``LogManager.create_topic``, which a broker
#: calls on its event loop when a first publish creates a topic) keeps its fsyncs whatever
#: its size.
WHOLE_SYNC_PARTITIONS = PARALLEL_FROM
# Without fsyncs to wait on, making the files is system time under the data directory's lock
# and the interpreter's: on threads they only take turns at a cost. Partitions made durable by
# a whole sync are therefore made on the calling thread. ``tidewire serve``, 3,000 topics of
# one partition 50 requests in flight: 1,377-1,903 -> 3,132-3,449 topics/s and 600-820 ->
# 233-270 broker CPU-us a topic (2 threads were as slow as 32); one topic of 10,000
# partitions, which synced file by file on 32 threads: 2,354-2,385 -> 5,342-5,565 partitions/s
# (alternating, 2026-11-28).


#: The name of a marker shared by several creations begins so (then 32 hex digits and
#: CREATING_SUFFIX): no topic name has a "+".
BATCH_MARKER_PREFIX = "creations+"


def marker_path(data_dir: str, topic: str) -> str:
    """The creation marker of ``topic``."""
    return f"{data_dir}/{topic}{CREATING_SUFFIX}"


def _marker_body(creations: Sequence[Creation], *, shared: bool) -> bytes:
    """A marker naming ``creations``: version 1 (one topic's ``TOPIC.creating``, as before
    batches) unless ``shared`` (a ``creations+HEX.creating``), then version 2."""
    if not shared:
        c = creations[0]
        one = {"version": 1, "topic": c.topic, "first": c.partitions.start}
        one["count"] = len(c.partitions)
        return json.dumps(one).encode() + b"\n"
    entries = [
        {"topic": c.topic, "first": c.partitions.start, "count": len(c.partitions)}
        for c in creations
    ]
    return json.dumps({"version": 2, "creations": entries}).encode() + b"\n"


#: Markers this process left behind in each data directory (a failed creation whose undoing
#: failed too) and the creations they still name. A creation of the same partitions later
#: takes them out of those markers first: else the next start would remove the new,
#: acknowledged topic with what was left of the failed one.
_left_behind: dict[str, dict[str, list[Creation]]] = {}
_left_lock = threading.Lock()


def _leave(data_dir: str, marker: str, creations: Sequence[Creation]) -> None:
    """Remember that ``marker`` was left naming ``creations``."""
    with _left_lock:
        _left_behind.setdefault(data_dir, {})[marker] = list(creations)


def _runs(partitions: list[int]) -> list[range]:
    """Sorted partition numbers as contiguous ranges."""
    out: list[range] = []
    for p in partitions:
        if out and out[-1].stop == p:
            out[-1] = range(out[-1].start, p + 1)
        else:
            out.append(range(p, p + 1))
    return out


def _release(fs: FileSystem, data_dir: str, creations: Sequence[Creation]) -> None:
    """Take the partitions of ``creations`` out of the markers this process left behind in
    ``data_dir``, durably, before they are created again (a marker left naming nothing else
    is removed). Blocking.

    Raises:
        OSError: a marker could not be rewritten or removed (nothing is created then).
    """
    with _left_lock:
        left = _left_behind.get(data_dir)
        if not left:
            return
        wanted = {(c.topic, p) for c in creations for p in c.partitions}
        for marker, named in list(left.items()):
            if not any((c.topic, p) in wanted for c in named for p in c.partitions):
                continue
            keep = [
                Creation(c.topic, run, c.config, c.config_json)
                for c in named
                for run in _runs([p for p in c.partitions if (c.topic, p) not in wanted])
            ]
            shared = marker.rsplit("/", 1)[-1].startswith(BATCH_MARKER_PREFIX)
            if not fs.exists(marker):
                pass  # its removal succeeded after all
            elif keep and (shared or len(keep) == 1):
                write_atomic(fs, marker, _marker_body(keep, shared=shared))
            else:
                if keep:  # a topic's own marker cannot name two runs: a shared one does
                    name = f"{BATCH_MARKER_PREFIX}{uuid.uuid4().hex}{CREATING_SUFFIX}"
                    moved = f"{data_dir}/{name}"
                    write_atomic(fs, moved, _marker_body(keep, shared=True))
                    left[moved] = keep
                fs.remove(marker)
                fs.sync_dir(data_dir)
            if keep and fs.exists(marker):
                left[marker] = keep
            else:
                del left[marker]


@dataclass(frozen=True, slots=True)
class Creation:
    """The partitions of one topic to create, all or none."""

    topic: str
    partitions: range
    config: LogConfig
    config_json: bytes


def create_partitions(
    fs: FileSystem,
    data_dir: str,
    topic: str,
    partitions: range,
    config: LogConfig,
    *,
    config_json: bytes,
    clock: Clock,
    config_file: str,
) -> list[PartitionLog]:
    """Create the logs of ``partitions`` of ``topic``, all or none. Blocking: call it on a
    worker thread for many partitions.

    Returns:
        The open logs, in partition order.

    Raises:
        OSError, StorageError: the first failure; nothing of the creation is left (or, if
            removing it failed too, the marker is, and the next open removes the rest).
    """
    (result,) = create_many(
        fs,
        data_dir,
        [Creation(topic, partitions, config, config_json)],
        clock=clock,
        config_file=config_file,
        whole_sync_partitions=None,
    )
    if isinstance(result, BaseException):
        raise result
    return result


def create_many(
    fs: FileSystem,
    data_dir: str,
    creations: list[Creation],
    *,
    clock: Clock,
    config_file: str,
    whole_sync_partitions: int | None = WHOLE_SYNC_PARTITIONS,
) -> list[list[PartitionLog] | BaseException]:
    """Create several topics' partitions at once, each topic all or none, as
    :func:`create_partitions` does for one: one marker names them all, and one ``syncfs`` of
    the data directory's file system (where the system has it:
    :meth:`FileSystem.open_whole_sync`) makes every partition durable instead of two fsyncs a
    partition and the data directory's first fsync; so does a lone creation of
    ``whole_sync_partitions`` partitions or more (None: never). Blocking.

    Returns:
        For each creation, in order: its open logs in partition order, or the first failure
        (OSError, StorageError) that undid it. A failure of a step they share (the marker, the
        whole sync, an fsync of the data directory) undoes every one of them.
    """
    whole: WholeSync | None = None
    partitions = sum(len(c.partitions) for c in creations)
    lone_whole = whole_sync_partitions is not None and partitions >= whole_sync_partitions
    if len(creations) >= WHOLE_SYNC_FROM or lone_whole:
        try:
            # opened before anything is written: write-back errors from now on are its sync's
            whole = fs.open_whole_sync(data_dir)
        except OSError as exc:
            log.warning("cannot open a sync of the file system of %s (%s)", data_dir, exc)
    try:
        return _create_many(fs, data_dir, creations, whole, clock=clock, config_file=config_file)
    finally:
        if whole is not None:
            whole.close()


def _create_many(
    fs: FileSystem,
    data_dir: str,
    creations: list[Creation],
    whole: WholeSync | None,
    *,
    clock: Clock,
    config_file: str,
) -> list[list[PartitionLog] | BaseException]:
    """:func:`create_many`'s work; with ``whole``, one sync of the whole file system makes
    every partition's files and entries durable instead of two fsyncs a partition."""
    lock = threading.Lock()
    made: list[list[str]] = [[] for _ in creations]
    opened: list[list[PartitionLog]] = [[] for _ in creations]
    failures: list[BaseException | None] = [None] * len(creations)
    shared = len(creations) > 1
    if not shared:
        marker = marker_path(data_dir, creations[0].topic)
    else:
        marker = f"{data_dir}/{BATCH_MARKER_PREFIX}{uuid.uuid4().hex}{CREATING_SUFFIX}"
    everything = range(len(creations))

    def fail(i: int, exc: BaseException) -> None:
        with lock:
            if failures[i] is None:
                failures[i] = exc

    def one(job: tuple[int, int]) -> None:
        i, p = job
        if failures[i] is not None:
            return  # another partition failed: the creation is being undone
        c = creations[i]
        directory = f"{data_dir}/{c.topic}-{p}"
        with lock:
            made[i].append(directory)
        try:
            fs.makedirs(directory)
            f = fs.open(f"{directory}/{config_file}", create=True)
            try:
                f.truncate(0)
                f.pwritev([c.config_json], 0)
                if whole is None:
                    f.sync()
            finally:
                f.close()
            # syncs the directory, unless the whole file system's sync does it below
            plog = PartitionLog.open(fs, directory, c.config, clock=clock, sync_new=whole is None)
        except BaseException as exc:
            fail(i, exc)
            raise
        with lock:
            opened[i].append(plog)

    def drop(i: int) -> OSError | None:
        """Abandon creation ``i``'s logs and remove its directories (not the marker)."""
        for plog in opened[i]:
            plog.abandon()
        opened[i] = []
        try:
            for directory in made[i]:
                if fs.exists(directory):
                    fs.rmtree(directory)
        except OSError as exc:
            return exc
        made[i] = []
        return None

    try:
        _release(fs, data_dir, creations)
    except OSError as exc:
        return [exc for _ in everything]
    try:
        # write_atomic's steps; the marker is new, so nothing is lost if it is torn
        write_atomic(fs, marker, _marker_body(creations, shared=shared))
    except BaseException as exc:
        for i in everything:
            fail(i, exc)
        if not _undo(fs, data_dir, marker, [], exc):
            _leave(data_dir, marker, creations)
        return [exc for _ in everything]
    _run_all(
        one,
        [(i, p) for i in everything for p in creations[i].partitions],
        ignore_failures=True,
        threads=whole is None,  # no fsync to wait on: see the note under WHOLE_SYNC_PARTITIONS
    )
    # The failed ones go before the marker does: their directories must not outlive it.
    stuck: list[int] = []
    for i in everything:
        if failures[i] is not None and drop(i) is not None:
            stuck.append(i)
    try:
        if whole is not None:
            # every made file's bytes and entry durable, every removed one gone
            whole.sync()
            for i in everything:
                for plog in opened[i]:
                    plog.directory_synced()
        else:
            fs.sync_dir(data_dir)  # every made entry is durable, every removed one gone
        if stuck:  # what is left of them stays named; the others are done
            write_atomic(fs, marker, _marker_body([creations[i] for i in stuck], shared=shared))
            _leave(data_dir, marker, [creations[i] for i in stuck])
            for i in stuck:
                why = failures[i]
                log.error(
                    "undoing the failed creation of topic %r (%s) failed too; the next start "
                    "removes what is left",
                    creations[i].topic,
                    why,
                )
        else:
            fs.remove(marker)
            fs.sync_dir(data_dir)
    except BaseException as exc:  # a shared step failed: every creation is undone
        for i in everything:
            fail(i, exc)
            for plog in opened[i]:
                plog.abandon()
            opened[i] = []
        if not _undo(fs, data_dir, marker, [d for i in everything for d in made[i]], exc):
            _leave(data_dir, marker, creations)
    out: list[list[PartitionLog] | BaseException] = []
    for i in everything:
        failure = failures[i]
        if failure is not None:
            out.append(failure)
        else:
            out.append(sorted(opened[i], key=lambda plog: int(plog.directory.rsplit("-", 1)[1])))
    return out


def _run_all(
    one: Callable[[T], None],
    jobs: Sequence[T],
    *,
    ignore_failures: bool = False,
    threads: bool = True,
) -> None:
    """``one(job)`` for every job, on a few threads when there are many (and ``threads``);
    raise the first failure once every started call has ended (``ignore_failures``: ``one``
    records them)."""
    if len(jobs) < PARALLEL_FROM or not threads:
        for job in jobs:
            try:
                one(job)
            except BaseException:
                if not ignore_failures:
                    raise
        return
    with concurrent.futures.ThreadPoolExecutor(
        CREATE_THREADS, thread_name_prefix="tidewire-create"
    ) as pool:
        futures = [pool.submit(one, job) for job in jobs]
    if ignore_failures:
        return
    for fut in futures:
        exc = fut.exception()
        if exc is not None:
            raise exc


def _undo(fs: FileSystem, data_dir: str, marker: str, made: list[str], why: BaseException) -> bool:
    """Remove the partition directories ``made`` and then the marker; if that fails, leave
    the marker, so the next open removes what is left. Whether everything was removed."""
    try:
        for directory in made:
            if fs.exists(directory):
                fs.rmtree(directory)
        fs.sync_dir(data_dir)
        for path in (marker + ".tmp", marker):
            if fs.exists(path):
                fs.remove(path)
                fs.sync_dir(data_dir)
    except OSError as exc:
        log.error(
            "undoing the failed creation under %s (%s) failed too: %s; the next start removes "
            "what is left",
            marker,
            why,
            exc,
        )
        return False
    return True


def mark_deleting(fs: FileSystem, data_dir: str, topic: str, directories: list[str]) -> str:
    """Write, durably, the marker of ``topic``'s deletion; return its path. Blocking."""
    marker = f"{data_dir}/{topic}{DELETING_SUFFIX}"
    names = [d.rsplit("/", 1)[-1] for d in directories]
    body = {"version": 1, "topic": topic, "directories": names}
    write_atomic(fs, marker, json.dumps(body).encode() + b"\n")
    return marker


def finish_deleting(fs: FileSystem, data_dir: str, marker: str, directories: list[str]) -> None:
    """Remove the directories of a deletion marked by :func:`mark_deleting`, then the marker.
    Blocking.

    Raises:
        OSError: a removal failed (the marker stays: the next open finishes the work).
    """
    for directory in directories:
        if fs.exists(directory):
            fs.rmtree(directory)
    fs.sync_dir(data_dir)
    fs.remove(marker)
    fs.sync_dir(data_dir)


def _finish_deletion_at_open(
    fs: FileSystem, data_dir: str, name: str, names: list[str]
) -> set[str]:
    path = f"{data_dir}/{name}"
    try:
        body = json.loads(fs.read_file(path))
        topic, doomed = str(body["topic"]), [str(n) for n in body["directories"]]
        if body.get("version") != 1 or f"{topic}{DELETING_SUFFIX}" != name:
            raise ValueError("unknown layout")
        if any(n.rsplit("-", 1)[0] != topic for n in doomed):
            raise ValueError("a directory of another topic")
    except (ValueError, KeyError, TypeError) as exc:
        log.error("ignoring unreadable topic deletion marker %s: %s", path, exc)
        return set()
    present = set(names)
    removed = [n for n in doomed if n in present]
    finish_deleting(fs, data_dir, path, [f"{data_dir}/{n}" for n in removed])
    log.info("finished deleting %d partition(s) of topic %r", len(removed), topic)
    return {*removed, name}


def remove_half_created(fs: FileSystem, data_dir: str, names: list[str]) -> list[str]:
    """Remove the partitions of every creation a crash interrupted (the markers in ``names``,
    the data directory's entries), then the markers; finish every interrupted deletion.

    Returns:
        ``names`` without the entries removed.

    Raises:
        OSError: a removal failed.
    """
    gone: set[str] = set()
    for name in names:
        if name.endswith(DELETING_SUFFIX):
            gone |= _finish_deletion_at_open(fs, data_dir, name, names)
            continue
        if name.endswith(
            (CREATING_SUFFIX + ".tmp", DELETING_SUFFIX + ".tmp")
        ):  # a marker never completed: no partitions
            fs.remove(f"{data_dir}/{name}")
            gone.add(name)
            continue
        if not name.endswith(CREATING_SUFFIX):
            continue
        path = f"{data_dir}/{name}"
        try:
            ranges = _read_creation_marker(name, fs.read_file(path))
        except (ValueError, KeyError, TypeError) as exc:
            # Written atomically, so never torn; something else wrote it. Removing partitions
            # on a guess could remove a real topic's data: leave both, and say so.
            log.error("ignoring unreadable topic creation marker %s: %s", path, exc)
            continue
        doomed = {
            f"{topic}-{p}": topic
            for topic, first, count in ranges
            for p in range(first, first + count)
        }
        removed = [n for n in names if n in doomed]
        for n in removed:
            fs.rmtree(f"{data_dir}/{n}")
        fs.sync_dir(data_dir)
        fs.remove(path)
        gone.update(removed)
        gone.add(name)
        for topic, first, count in ranges:
            log.warning(
                "removed %d partition(s) of topic %r whose creation (partitions %d..%d) was "
                "interrupted",
                sum(1 for n in removed if doomed[n] == topic),
                topic,
                first,
                first + count - 1,
            )
    if gone:
        fs.sync_dir(data_dir)
    return [n for n in names if n not in gone]


def _read_creation_marker(name: str, raw: bytes) -> list[tuple[str, int, int]]:
    """The (topic, first partition, count) of each creation the marker ``name`` names.

    Raises:
        ValueError, KeyError, TypeError: it is not a marker this module wrote.
    """
    body = json.loads(raw)
    if body.get("version") == 1:
        topic, first, count = str(body["topic"]), int(body["first"]), int(body["count"])
        if f"{topic}{CREATING_SUFFIX}" != name:
            raise ValueError("the marker of another topic")
        return [(topic, first, count)]
    if body.get("version") != 2 or not name.startswith(BATCH_MARKER_PREFIX):
        raise ValueError("unknown layout")
    out = [(str(c["topic"]), int(c["first"]), int(c["count"])) for c in body["creations"]]
    if any("/" in topic or topic in {"", ".", ".."} for topic, _, _ in out):
        raise ValueError("not a topic's name")
    return out
