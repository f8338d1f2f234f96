"""Idempotent producers: what each producer id stored last in a partition, so that a batch sent
again is stored once, a batch that skips a sequence is refused, and an older instance of a
producer is fenced (the rules are in docs/protocol.md, "Idempotent producers").

A :class:`PartitionProducers` holds one partition's state; it is rebuilt at start from the batch
headers of the log (:meth:`PartitionProducers.observe`), from a snapshot onwards when one is
valid (:func:`encode_snapshot`, :func:`decode_snapshot`). :class:`ProducerIds` hands out
producer ids that one data directory never hands out twice.

Writers (docs/protocol.md, "Deterministic writers") are producers whose id is derived from a
name the client chooses (:func:`writer_producer_id`), such as a Spark task's query, batch and
partition: every attempt of that task gets the same id with a higher epoch, continues the
sequences where the broker's state says the last attempt stopped, and so stores each record
once however often the task runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from tidewire.errors import (
    DuplicateSequenceError,
    InvalidRequestError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)
from tidewire.records.batch import BatchHeader
from tidewire.storage.fs import FileSystem, write_atomic

__all__ = [
    "KEEP_BATCHES",
    "MAX_NODE_ID",
    "MAX_WRITER_ID",
    "NODE_ID_SHIFT",
    "SEQ_MOD",
    "WRITER_PID_BASE",
    "PartitionProducers",
    "ProducerEntry",
    "ProducerIds",
    "StoredBatch",
    "decode_snapshot",
    "encode_snapshot",
    "is_writer",
    "node_id_floor",
    "writer_producer_id",
]

#: Sequences are int32 and wrap from 2**31 - 1 to 0.
SEQ_MOD = 1 << 31
#: Batches per producer and partition whose offsets a duplicate is answered with.
KEEP_BATCHES = 5
#: The largest producer epoch; a producer at it gets a new id when it asks again.
MAX_EPOCH = 32767
#: Producer ids are reserved on disk in blocks of this many.
ID_BLOCK = 1000
#: Name of the snapshot file in a partition's directory.
SNAPSHOT_FILE = "producers.snapshot"
#: Name of the file in the data directory that holds the next free block of producer ids.
PRODUCER_IDS_FILE = "producer_ids"
#: In a cluster, node ``n`` hands out producer ids from ``n << NODE_ID_SHIFT`` on (see
#: :func:`node_id_floor`): 2**40 ids per node, for node ids below 2**22.
NODE_ID_SHIFT = 40
#: The largest node id whose range of producer ids stays below :data:`WRITER_PID_BASE`.
MAX_NODE_ID = (1 << (62 - NODE_ID_SHIFT)) - 1
#: Writers' producer ids lie in [2**62, 2**63): derived from the writer id by a 62-bit hash.
#: Ids handed out one by one count up from 0 and never get there.
WRITER_PID_BASE = 1 << 62
#: The longest writer id, in UTF-8 bytes: room for a query id, a batch id and a partition,
#: short enough that thousands fit in one request.
MAX_WRITER_ID = 255


def writer_producer_id(writer_id: str) -> int:
    """The producer id of the writer named ``writer_id``: the same on every broker and across
    restarts, so nothing needs to be stored to find it again.

    Two writer ids share a producer id with a probability of about n**2 / 2**63 for n writers
    alive at once (1 in 10**9 for 100,000).

    Raises:
        InvalidRequestError: an empty id, or one over :data:`MAX_WRITER_ID` bytes.
    """
    raw = writer_id.encode()
    if not 1 <= len(raw) <= MAX_WRITER_ID:
        raise InvalidRequestError(
            f"a writer id has 1..{MAX_WRITER_ID} bytes of UTF-8, not {len(raw):,}"
        )
    digest = hashlib.blake2b(raw, digest_size=8, person=b"tidewire.writer").digest()
    return WRITER_PID_BASE | (int.from_bytes(digest, "big") >> 2)


def node_id_floor(node_id: int) -> int:
    """The first producer id cluster node ``node_id`` hands out: each node counts up in a range
    of its own, ``[node_id << 40, (node_id + 1) << 40)``, so no two nodes hand out one id.

    Why ranges and not blocks reserved in etcd: a node hands out ids with no round trip to
    etcd (a producer starts while etcd is slow or away, as on a single node), a range cannot
    be lost or reserved twice by a compare-and-swap race, and 2**40 ids per node is more than
    a node hands out in its life (a million a second for 12 days). Node ids are unique among
    the live nodes (a lease in etcd), and a node id keeps its data directory, so its counter
    (on disk, in blocks) goes on where it stopped. Writers' ids (>= 2**62) are outside every
    range.

    Raises:
        ValueError: a node id outside ``0..MAX_NODE_ID``.
    """
    if not 0 <= node_id <= MAX_NODE_ID:
        raise ValueError(f"a node id is 0..{MAX_NODE_ID:,} (producer id ranges), not {node_id}")
    return node_id << NODE_ID_SHIFT


def is_writer(producer_id: int) -> bool:
    """Whether ``producer_id`` is a writer's (see :func:`writer_producer_id`)."""
    return producer_id >= WRITER_PID_BASE


@dataclass(slots=True)
class StoredBatch:
    """An idempotent batch a partition stored (or is storing)."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    #: While its append is in flight: resolves to True once stored, False if it failed.
    done: asyncio.Future[bool] | None = None
    #: The producer's ``(epoch, last_seq)`` in this partition before this batch was recorded:
    #: what a failed append rolls back to.
    prev: tuple[int, int | None] | None = None


@dataclass(slots=True)
class ProducerEntry:
    """One producer id's state in one partition.

    ``last_seq`` is None after an append of this producer failed: the partition no longer
    knows which sequence comes next, so it takes any (duplicates of the remembered batches are
    still recognised).
    """

    epoch: int
    last_seq: int | None
    last_ms: int
    batches: deque[StoredBatch] = field(default_factory=lambda: deque(maxlen=KEEP_BATCHES))
    #: While failed appends are being rolled back: the earliest failed batch's base offset
    #: and the state before it (see :meth:`PartitionProducers.forget`).
    rollback: tuple[int, tuple[int, int | None] | None] | None = None


def _last_seq(h: BatchHeader) -> int:
    return (h.base_sequence + h.last_offset_delta) % SEQ_MOD


class PartitionProducers:
    """The idempotent producers of one partition."""

    def __init__(self) -> None:
        self.entries: dict[int, ProducerEntry] = {}
        #: Whether the state changed since the last snapshot.
        self.changed = False

    def plan(
        self, headers: Sequence[BatchHeader], epochs: dict[int, int]
    ) -> list[StoredBatch | None]:
        """Decide, for each batch of one produce request, whether to store it (``None``) or
        whether it is a remembered batch sent again (that batch). All or nothing: an error for
        any batch raises before anything is changed.

        Args:
            headers: the request's batches for this partition, in order.
            epochs: producer id -> the newest epoch the broker knows of.

        Raises:
            ProducerFencedError: an epoch older than the producer id's newest.
            OutOfOrderSequenceError: a sequence that is not the next one.
            DuplicateSequenceError: a batch stored before, too long ago to answer.
        """
        out: list[StoredBatch | None] = []
        planned: dict[int, tuple[int, int]] = {}  # producer id -> (epoch, last seq) so far
        for h in headers:
            pid = h.producer_id
            if pid < 0:
                out.append(None)
                continue
            epoch, first, last = h.producer_epoch, h.base_sequence, _last_seq(h)
            if epoch < 0 or first < 0:
                raise InvalidRequestError(
                    f"an idempotent batch (producer id {pid}) needs producer_epoch >= 0 and "
                    f"base_sequence >= 0, not {epoch} and {first}"
                )
            newest = epochs.get(pid, -1)
            if epoch < newest:
                raise ProducerFencedError(
                    f"producer id {pid} epoch {epoch} is fenced: epoch {newest} exists"
                )
            entry = self.entries.get(pid)
            state = planned.get(pid)
            if state is None and entry is not None:
                state = (entry.epoch, -1 if entry.last_seq is None else entry.last_seq)
            if state is None or (state[1] == -1 and epoch == state[0]):
                # A producer this partition holds nothing of (or lost track of): any sequence,
                # but a batch it remembers is still answered as a duplicate.
                dup = self._remembered(entry, epoch, first, last) if pid not in planned else None
                if dup is not None:
                    out.append(dup)
                    continue
            elif epoch < state[0]:
                raise ProducerFencedError(
                    f"producer id {pid} epoch {epoch} is fenced: epoch {state[0]} wrote here"
                )
            elif epoch > state[0]:
                if is_writer(pid):
                    # A writer's sequences count its records, whatever instance sends them:
                    # a new epoch continues where the last one stopped.
                    if state[1] != -1 and first != (state[1] + 1) % SEQ_MOD:
                        raise OutOfOrderSequenceError(
                            f"writer producer id {pid}: the first batch of epoch {epoch} has "
                            f"sequence {first}, where {(state[1] + 1) % SEQ_MOD} was next"
                        )
                elif first != 0:
                    raise OutOfOrderSequenceError(
                        f"producer id {pid}: the first batch of epoch {epoch} has sequence "
                        f"{first}, not 0"
                    )
            elif first != (state[1] + 1) % SEQ_MOD:
                dup = self._remembered(entry, epoch, first, last) if pid not in planned else None
                if dup is not None:
                    out.append(dup)
                    continue
                behind = (state[1] - last) % SEQ_MOD
                if entry is not None and pid not in planned and behind < SEQ_MOD // 2:
                    raise DuplicateSequenceError(
                        f"producer id {pid}: sequences {first}..{last} were stored before "
                        f"(last stored: {state[1]}); only the last {KEEP_BATCHES} batches' "
                        "offsets are kept"
                    )
                raise OutOfOrderSequenceError(
                    f"producer id {pid} epoch {epoch}: sequence {first} where "
                    f"{(state[1] + 1) % SEQ_MOD} was next"
                )
            planned[pid] = (epoch, last)
            out.append(None)
        return out

    @staticmethod
    def _remembered(
        entry: ProducerEntry | None, epoch: int, first: int, last: int
    ) -> StoredBatch | None:
        if entry is None or entry.epoch != epoch:
            return None
        for b in entry.batches:
            if b.first_seq == first and b.last_seq == last:
                return b
        return None

    def record(
        self,
        h: BatchHeader,
        base_offset: int,
        now_ms: int,
        done: asyncio.Future[bool] | None = None,
    ) -> StoredBatch:
        """Remember that ``h`` is stored (or being stored) from ``base_offset`` on."""
        last = _last_seq(h)
        b = StoredBatch(h.base_sequence, last, base_offset, base_offset + h.last_offset_delta, done)
        entry = self.entries.get(h.producer_id)
        # What a failed append rolls back to: the state before, or for a producer new here,
        # one that expects this very batch next (so no later batch can pass over it).
        b.prev = (
            (entry.epoch, entry.last_seq)
            if entry is not None
            else (h.producer_epoch, (h.base_sequence - 1) % SEQ_MOD)
        )
        if entry is None or entry.epoch != h.producer_epoch:
            entry = self.entries[h.producer_id] = ProducerEntry(h.producer_epoch, last, now_ms)
        else:
            entry.last_seq, entry.last_ms = last, now_ms
        entry.batches.append(b)
        self.changed = True
        return b

    def forget(self, pid: int, batches: Sequence[StoredBatch]) -> None:
        """The appends of ``batches`` (one request's, of producer ``pid``) failed: nothing of
        them is in the log. Roll the producer's state back to before the earliest of them.

        A failed write is undone together with every write queued after it, and each of
        those requests calls this in turn, in any order: the state is rolled back once no
        batch recorded after the earliest failed one is left, to the state before that one.
        (Taking any sequence instead would let a later batch pass over the failed ones, and
        their retry would then be answered as a duplicate of data that was never stored.)
        """
        entry = self.entries.get(pid)
        if entry is None or not batches:
            return
        first = min(batches, key=lambda b: b.base_offset)
        if entry.rollback is None or first.base_offset < entry.rollback[0]:
            entry.rollback = (first.base_offset, first.prev)
        gone = {id(b) for b in batches}
        kept = [b for b in entry.batches if id(b) not in gone]
        entry.batches.clear()
        entry.batches.extend(kept)
        self.changed = True
        base, prev = entry.rollback
        if any(b.base_offset >= base for b in kept):
            return  # batches recorded after it fail too; the last of them rolls back
        entry.rollback = None
        if prev is not None:
            entry.epoch, entry.last_seq = prev

    async def settled(self, pid: int) -> ProducerEntry | None:
        """``pid``'s entry once none of its appends is in flight (each failed one rolled
        back), or None if this partition holds nothing of it."""
        for _ in range(KEEP_BATCHES * 4):  # each round waits for real appends to end
            entry = self.entries.get(pid)
            if entry is None:
                return None
            flying = [b.done for b in entry.batches if b.done is not None and not b.done.done()]
            if not flying:
                return entry
            await asyncio.wait([asyncio.shield(f) for f in flying])
        return self.entries.get(pid)

    def observe(self, h: BatchHeader, now_ms: int) -> None:
        """Take a batch read from the log into the state (rebuilding it at start)."""
        if h.producer_id >= 0:
            self.record(h, h.base_offset, now_ms)

    def expire(self, older_than_ms: int) -> int:
        """Forget producers whose last write here is older than ``older_than_ms``."""
        old = [pid for pid, e in self.entries.items() if e.last_ms < older_than_ms]
        for pid in old:
            del self.entries[pid]
        if old:
            self.changed = True
        return len(old)


# --- snapshots ----------------------------------------------------------------------------------


class _SnapBatch(msgspec.Struct, array_like=True):
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int


class _SnapEntry(msgspec.Struct, array_like=True):
    producer_id: int
    epoch: int
    last_seq: int  # -1: unknown
    last_ms: int
    batches: list[_SnapBatch]


class _Snapshot(msgspec.Struct):
    version: int
    offset: int
    entries: list[_SnapEntry]


def encode_snapshot(state: PartitionProducers, offset: int) -> bytes:
    """The state, as it is with the log ending at ``offset``.

    A batch whose append is still in flight is not in the snapshot, and the snapshot is
    stamped at the offset of the earliest such batch instead of ``offset``: a start from it
    then reads those batches from the log (where they are, if they were stored) rather than
    trusting a state that never saw them.
    """
    flying = [
        b.base_offset
        for e in state.entries.values()
        for b in e.batches
        if b.done is not None and not (b.done.done() and b.done.result())
    ]
    offset = min([offset, *flying])
    entries = []
    for pid, e in sorted(state.entries.items()):
        kept = [b for b in e.batches if b.last_offset < offset]
        if len(kept) == len(e.batches):
            last = -1 if e.last_seq is None else e.last_seq
        else:  # its state at ``offset``: after its last batch below it, if that is known
            last = kept[-1].last_seq if kept else -1
        entries.append(
            _SnapEntry(
                pid,
                e.epoch,
                last,
                e.last_ms,
                [_SnapBatch(b.first_seq, b.last_seq, b.base_offset, b.last_offset) for b in kept],
            )
        )
    return msgspec.msgpack.encode(_Snapshot(1, offset, entries))


def decode_snapshot(data: bytes) -> tuple[int, PartitionProducers]:
    """The log end offset a snapshot was taken at, and the state.

    Raises:
        ValueError: the snapshot cannot be read.
    """
    try:
        snap = msgspec.msgpack.decode(data, type=_Snapshot)
    except msgspec.DecodeError as exc:
        raise ValueError(f"unreadable producer snapshot: {exc}") from None
    if snap.version != 1:
        raise ValueError(f"producer snapshot version {snap.version} is not supported")
    state = PartitionProducers()
    for e in snap.entries:
        entry = ProducerEntry(e.epoch, None if e.last_seq < 0 else e.last_seq, e.last_ms)
        entry.batches.extend(
            StoredBatch(b.first_seq, b.last_seq, b.base_offset, b.last_offset) for b in e.batches
        )
        state.entries[e.producer_id] = entry
    return snap.offset, state


# --- producer ids -------------------------------------------------------------------------------


class ProducerIds:
    """Hands out producer ids, and remembers epoch bumps that no log shows yet.

    A block of :data:`ID_BLOCK` ids is reserved on disk (atomically, in
    ``PRODUCER_IDS_FILE``) before any id of it is handed out, so an id is never handed out
    twice, even across crashes. An epoch bump (a producer starting again with its id) is
    written there too before it is answered, so the older instance stays fenced after a
    restart even if the new one has not written yet.

    Args:
        fs: the data directory's file system.
        path: the file's path.
        seen: the largest producer id found in the logs (-1: none).

    Raises:
        ValueError: the file is unreadable.
    """

    def __init__(self, fs: FileSystem, path: str, seen: int = -1) -> None:
        self.fs = fs
        self.path = path
        self._reserved = 0
        #: producer id -> epoch bumped to (only bumps that the logs may not show)
        self.epochs: dict[int, int] = {}
        #: writer producer id -> (its newest epoch, when it was handed out, ms): kept until
        #: the writer is released or expires
        self.writers: dict[int, tuple[int, int]] = {}
        if fs.exists(path):
            try:
                doc = json.loads(fs.read_file(path))
                self._reserved = int(doc["next_block"])
                self.epochs = {int(k): int(v) for k, v in doc.get("epochs", {}).items()}
                self.writers = {
                    int(k): (int(v[0]), int(v[1])) for k, v in doc.get("writers", {}).items()
                }
            except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
                raise ValueError(f"{path} is unreadable: {exc}") from None
        self._next = max(self._reserved, seen + 1)
        self._block_end = self._next  # nothing reserved for this run yet
        #: This node's range of ids (cluster mode, :meth:`use_range`); a single node's is all.
        self.floor = 0
        self._range_end: int | None = None

    def use_range(self, floor: int, end: int, seen: int) -> None:
        """Hand out ids in ``[floor, end)`` only (a cluster node's range,
        :func:`node_id_floor`), going on after ``seen`` (the largest id of the range found in
        the logs, -1: none) and after the block reserved on disk if that lies in the range.
        Ids outside the range (other nodes') count as issued (:meth:`issued`): they were
        handed out by the node whose range holds them."""
        self.floor, self._range_end = floor, end
        start = self._reserved if floor <= self._reserved < end else floor
        self._next = max(start, seen + 1, floor)
        self._block_end = self._next  # the next take reserves a block in the range

    def next_needs_reserve(self) -> bool:
        """Whether :meth:`take` must reserve a new block on disk first."""
        return self._next >= self._block_end

    def _write(self) -> None:
        doc: dict[str, object] = {
            "next_block": self._reserved,
            "epochs": {str(k): v for k, v in self.epochs.items()},
        }
        if self.writers:
            doc["writers"] = {str(k): list(v) for k, v in self.writers.items()}
        write_atomic(self.fs, self.path, json.dumps(doc).encode() + b"\n")

    def reserve(self) -> None:
        """Reserve the next block on disk (blocking I/O: run it off the event loop)."""
        end = self._block_end if self._next < self._block_end else self._next + ID_BLOCK
        if self._range_end is not None:
            # Where this node goes on after a restart (a value left from another range is
            # overwritten: it is ignored at load anyway).
            end = min(end, self._range_end)
            if self._next >= end:
                raise OSError(f"this node's producer ids [{self.floor}, {end}) are used up")
            self._reserved = end
        else:
            self._reserved = max(self._reserved, end)
        self._write()
        self._block_end = end

    def bump(self, pid: int, epoch: int) -> None:
        """Record on disk that ``pid`` is at ``epoch`` now (blocking I/O)."""
        self.epochs[pid] = epoch
        self._write()

    def bump_writer(self, pid: int, epoch: int, now_ms: int) -> None:
        """Record on disk that writer ``pid`` is at ``epoch`` now (blocking I/O)."""
        self.writers[pid] = (epoch, now_ms)
        self._write()

    def drop_writers(self, pids: set[int]) -> None:
        """Forget these writers on disk (blocking I/O; nothing is written if none is known)."""
        if any(pid in self.writers for pid in pids):
            for pid in pids:
                self.writers.pop(pid, None)
            self._write()

    def take(self) -> int:
        """The next producer id (call :meth:`reserve` first when it is needed)."""
        if self.next_needs_reserve():
            raise RuntimeError("no producer id reserved")
        pid = self._next
        self._next += 1
        return pid

    def issued(self, pid: int) -> bool:
        """Whether ``pid`` may have been handed out by this data directory (in a cluster: by
        this node, or by another node, whose range holds it)."""
        if self._range_end is not None and not self.floor <= pid < self._range_end:
            return 0 <= pid < WRITER_PID_BASE
        return 0 <= pid < self._next
