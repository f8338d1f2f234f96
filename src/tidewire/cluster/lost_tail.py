"""Replicas that may have lost their unflushed tail, and the rule that keeps them from leading.

Under ``fsync=interval`` (or ``never``) an ``acks=all`` produce is answered once every in-sync
replica has *written* the batch, not synced it. A node that stops without a clean shutdown
(a kernel crash, a power cut) loses what the OS had not written to disk yet: its log comes
back shorter, and the records it lost may have been acknowledged. Elected leader, such a
replica would make the others cut their copies of those records (divergence, KIP-101) and lose
them for good.

A process that dies (SIGKILL, an exception, the OOM killer) loses nothing it wrote: the log's
appends go to the kernel with ``pwritev`` at once, and the page cache outlives the process.
Only the machine going down (a kernel crash, a power cut) loses the unflushed tail. So a node
tells the two apart by the kernel's boot id (``/proc/sys/kernel/random/boot_id``), kept in
``.boot-id`` in its data directory at every start (:func:`same_boot`): an unclean shutdown on
the boot still running lost nothing.

So a node that starts after an unclean shutdown of an earlier boot *marks* each of its
replicated logs whose fsync policy is not ``always`` in etcd, before it registers:
``<root>lost-tail/<node>/<topic>/<partition>`` holding the log's recovered end and its topic's
incarnation id. Marks have no lease: they outlive the node (a clean restart later does not
bring back what was lost). The rule (Kafka keeps such a broker out of the eligible leader
replicas, KIP-966):

- the controller never elects a marked replica while the partition has an unmarked in-sync
  replica alive; with none, the partition stays offline (its ISR kept), unless the topic
  allows unclean election: then a live unmarked replica leads, else the marked one holding
  the most (largest recovered end);
- a leadership decided before the mark was written (the node restarted within its session
  and found itself still named leader) is void: the controller elects again, and the node
  does not take it up meanwhile;
- a mark is deleted once the replica holds everything its leader counts as replicated (its
  log end reached the high watermark a leader gave it) or once it was elected knowingly
  (unclean election): from then on its log is as good as any follower's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from tidewire.storage import FsyncPolicy
from tidewire.storage.fs import FileSystem, write_atomic

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.cluster.metadata import MetadataStore

__all__ = [
    "BOOT_ID_FILE",
    "LostTail",
    "LostTails",
    "kernel_boot_id",
    "lost_tail_prefix",
    "read_lost_tails",
    "same_boot",
]

log = logging.getLogger(__name__)

Key = tuple[str, int]


class _Mark(msgspec.Struct, frozen=True):
    end: int
    topic_id: str = ""


@dataclass(frozen=True)
class LostTail:
    """A mark: the replica's log end after its recovery, its topic's incarnation id, and the
    etcd revision the mark was written at."""

    end: int
    topic_id: str
    revision: int


def lost_tail_prefix(store: MetadataStore) -> str:
    return f"{store.root}lost-tail/"


def lost_tail_key(store: MetadataStore, node: int, topic: str, partition: int) -> str:
    return f"{lost_tail_prefix(store)}{node}/{topic}/{partition}"


async def read_lost_tails(store: MetadataStore) -> dict[Key, dict[int, LostTail]]:
    """Every mark in etcd: partition -> node -> mark.

    Raises:
        EtcdError: etcd did not answer.
    """
    prefix = lost_tail_prefix(store)
    kvs, _ = await store.etcd.range(prefix, prefix=True)
    out: dict[Key, dict[int, LostTail]] = {}
    for kv in kvs:
        rel = kv.key.decode()[len(prefix) :]
        node, _, rest = rel.partition("/")
        topic, _, p = rest.rpartition("/")
        try:
            mark = msgspec.json.decode(kv.value, type=_Mark)
            out.setdefault((topic, int(p)), {})[int(node)] = LostTail(
                mark.end, mark.topic_id, kv.mod_revision
            )
        except (ValueError, msgspec.DecodeError):
            log.warning("ignoring a malformed lost-tail mark %s", kv.key.decode())
    return out


def marks_of(
    marks: Mapping[Key, Mapping[int, LostTail]], key: Key, topic_id: str
) -> dict[int, LostTail]:
    """The marks of one partition that belong to its current incarnation."""
    return {
        n: m
        for n, m in marks.get(key, {}).items()
        if not m.topic_id or not topic_id or m.topic_id == topic_id
    }


#: The file in a node's data directory holding the kernel's boot id of its last start.
BOOT_ID_FILE = ".boot-id"
#: Where Linux tells its boot id (a new random UUID at every boot).
KERNEL_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def kernel_boot_id(path: str = KERNEL_BOOT_ID) -> str:
    """The running kernel's boot id; empty where the system does not tell it."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, ValueError):
        return ""


def same_boot(fs: FileSystem, data_dir: str, current: str) -> bool:
    """Whether the data directory's last start was on the boot still running (``current``,
    :func:`kernel_boot_id`), so its page cache, and with it everything its logs wrote, is still
    there; then records ``current`` for the next start. False when either boot id is
    unknown (the unflushed tail may be lost).

    Raises:
        OSError: the boot id could not be recorded (the node does not start: its next
            start could not tell).
    """
    path = f"{data_dir}/{BOOT_ID_FILE}"
    try:
        previous = fs.read_file(path).decode().strip() if fs.exists(path) else ""
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("%s unreadable (%s): taken as another boot", path, exc)
        previous = ""
    if current and previous != current:
        write_atomic(fs, path, current.encode() + b"\n")
    return bool(current) and previous == current


class LostTails:
    """This node's own marks: written at a start after an unclean shutdown, deleted as its
    replicas recover (see the module's docstring)."""

    def __init__(self, store: MetadataStore, node_id: int) -> None:
        self.store = store
        self.node_id = node_id
        #: partition -> mark, as this node knows it
        self.marks: dict[Key, LostTail] = {}
        self._clearing: set[Key] = set()

    async def load_and_mark(self, broker: Broker, *, clean: bool, id_file: str) -> None:
        """Read this node's marks left from before, then, after an unclean shutdown, mark
        every local log of a cluster's topic (one holding an incarnation id in ``id_file``)
        whose fsync policy is not ``always``.

        Raises:
            EtcdError: etcd did not answer (the node does not start: it would lead unmarked).
        """
        mine = await read_lost_tails(self.store)
        for key, by_node in mine.items():
            if self.node_id in by_node:
                self.marks[key] = by_node[self.node_id]
        if clean:
            return
        fs = broker.logs.fs
        for key, plog in sorted(broker.logs.logs.items()):
            if plog.config.fsync is FsyncPolicy.ALWAYS:
                continue
            path = f"{plog.directory}/{id_file}"
            try:
                topic_id = fs.read_file(path).decode().strip() if fs.exists(path) else ""
            except OSError as exc:
                log.warning("%s: topic id not read (%s): marked all the same", path, exc)
                topic_id = ""
            if not topic_id and key[0].startswith("__"):
                continue  # the broker's own internal logs: not replicated
            end = plog.log_end_offset
            value = msgspec.json.encode(_Mark(end, topic_id))
            rev = await self.store.etcd.put(lost_tail_key(self.store, self.node_id, *key), value)
            self.marks[key] = LostTail(end, topic_id, rev)
            log.warning(
                "node %d: %s/%d recovered to offset %d after an unclean shutdown (fsync %s): "
                "it may have lost acknowledged records, so it does not lead until it caught up",
                self.node_id,
                key[0],
                key[1],
                end,
                plog.config.fsync.value,
            )

    def voids(self, key: Key, version: int) -> bool:
        """Whether a leadership of ``key`` given to this node at partition ``version`` (etcd's
        mod revision) was decided before this node's mark: not to be taken up."""
        mark = self.marks.get(key)
        return mark is not None and mark.revision > version

    def clear_soon(self, key: Key) -> None:
        """Delete the mark of ``key`` (in the background; again later if etcd fails)."""
        if key not in self.marks or key in self._clearing:
            return
        self._clearing.add(key)
        task = asyncio.get_running_loop().create_task(self._clear(key))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _clear(self, key: Key) -> None:
        try:
            await self.store.etcd.delete(lost_tail_key(self.store, self.node_id, *key))
        except Exception as exc:  # etcd away: the next caught-up fetch tries again
            log.warning("node %d: lost-tail mark of %s/%d not deleted: %s", self.node_id, *key, exc)
            return
        finally:
            self._clearing.discard(key)
        self.marks.pop(key, None)
        log.info("node %d: %s/%d caught up; its lost-tail mark is deleted", self.node_id, *key)
