"""The cluster's metadata in etcd, and a node's local copy of it.

Keys, under ``/tidewire/<cluster id>/`` (values are JSON):

- ``nodes/<node id>``: a node's addresses, on the node's lease: it goes when the node does;
- ``topics/<name>``: a topic's partition count and settings;
- ``partitions/<topic>/<partition>``: its replicas, leader, leader epoch and in-sync replicas;
- ``reassign/<topic>/<partition>``: a partition's target replica set while it is being moved
  (:mod:`tidewire.cluster.reassign`); deleted, with the partition's last change, when done;
- ``controller``: the election of the one node that places replicas and moves leadership;
- ``producer-epochs/<producer id>/<epoch>``: an idempotent producer's epoch bump, made by
  the node that answered it (empty value, on a lease of about the producers' expiration time):
  every node fences the older epochs of that id at once, not only once the new epoch has
  written to each partition.

Every change is a compare-and-swap transaction: a topic is created only if it does not exist, a
partition's state changes only from the version (``mod_revision``) the writer read, and a
controller's writes also compare its election key (the fencing token, see
:mod:`tidewire.cluster.etcd`). :class:`MetadataCache` reads everything once and then follows a
watch from the revision of that read, so a node's view is etcd's at some revision, never a mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from tidewire.cluster.etcd import (
    Compare,
    EtcdClient,
    EtcdError,
    EtcdUnavailableError,
    KeyValue,
    LeaderKey,
    Op,
    WatchCompactedError,
)

__all__ = [
    "Fence",
    "MetadataCache",
    "MetadataStore",
    "NodeIdTakenError",
    "NodeInfo",
    "PartitionState",
    "Reassignment",
    "TopicInfo",
]

log = logging.getLogger("tidewire.cluster")

#: No leader (a partition whose in-sync replicas are all gone, with unclean election off).
NO_LEADER = -1


class NodeIdTakenError(EtcdError):
    """A node registering under an id that a live node's lease holds."""


class NodeInfo(msgspec.Struct, frozen=True):
    node_id: int
    host: str
    port: int
    http_port: int = -1
    kafka_port: int = -1
    #: The host Kafka clients are told to reach this node's Kafka listener at ("": ``host``).
    kafka_host: str = ""

    @property
    def url_host(self) -> str:
        """``host`` as it goes before ``:port`` in an address or a URL (an IPv6 address in
        brackets)."""
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def address(self) -> str:
        """``host:port`` of the node's binary protocol listener."""
        return f"{self.url_host}:{self.port}"


class TopicInfo(msgspec.Struct, frozen=True):
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = {}
    #: This incarnation of the topic (a random id made at its creation; "" for a topic made
    #: before ids): a replica's log of an earlier topic of the same name is not this one's.
    topic_id: str = ""


class PartitionState(msgspec.Struct, frozen=True):
    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]


class Reassignment(msgspec.Struct, frozen=True):
    """A partition being moved: the replica set it is to end with (its first is the
    preferred leader), and the one it had when the move started (what a cancel reverts to;
    empty in entries written before cancels existed)."""

    target: tuple[int, ...]
    original: tuple[int, ...] = ()


@dataclass(frozen=True)
class Fence:
    """A controller's fencing token: its election key and the revision it was won at."""

    key: bytes
    rev: int

    @classmethod
    def of(cls, leader: LeaderKey) -> Fence:
        return cls(leader.key, leader.rev)

    def compare(self) -> Compare:
        return Compare.create_revision(self.key, "=", self.rev)


_enc = msgspec.json.Encoder()


class TransientQueueRecord(msgspec.Struct, frozen=True):
    """The value of a transient queue's etcd key: the node that declared and serves it,
    and the queue's settings (a ``QueueSpec`` as JSON, decoded by the queues' side)."""

    node: int
    spec: msgspec.Raw = msgspec.Raw(b"null")


class MetadataStore:
    """Reads and compare-and-swap writes of the metadata of cluster ``cluster_id``."""

    def __init__(self, etcd: EtcdClient, cluster_id: str) -> None:
        if not cluster_id or "/" in cluster_id:
            raise ValueError(f"a cluster id is a non-empty name without '/', not {cluster_id!r}")
        self.etcd = etcd
        self.root = f"/tidewire/{cluster_id}/"

    def node_key(self, node_id: int) -> str:
        return f"{self.root}nodes/{node_id}"

    def topic_key(self, name: str) -> str:
        return f"{self.root}topics/{name}"

    def partition_key(self, topic: str, partition: int) -> str:
        return f"{self.root}partitions/{topic}/{partition}"

    def reassign_key(self, topic: str, partition: int) -> str:
        return f"{self.root}reassign/{topic}/{partition}"

    def producer_epoch_key(self, producer_id: int, epoch: int) -> str:
        return f"{self.root}producer-epochs/{producer_id}/{epoch}"

    async def record_producer_epoch(self, producer_id: int, epoch: int, lease: int) -> None:
        """Tell every node that ``producer_id`` is at ``epoch`` now: a key per bump (bumps
        of one id never overwrite each other: each node keeps the largest), on ``lease`` so
        that the bumps of producers long gone leave etcd.

        Raises:
            EtcdError: not recorded (the lease expired, etcd did not answer).
        """
        await self.etcd.put(self.producer_epoch_key(producer_id, epoch), b"", lease=lease)

    @property
    def controller_election(self) -> str:
        return f"{self.root}controller"

    async def register(self, node: NodeInfo, lease: int) -> None:
        """Put the node's addresses on its lease. Refused while another live node holds the
        same id (its key exists on another lease)."""
        key = self.node_key(node.node_id)
        r = await self.etcd.txn(
            [Compare.create_revision(key, "=", 0)],
            [Op.put(key, _enc.encode(node), lease)],
            [Op.get(key)],
        )
        if not r.succeeded:
            held = r.responses[0][0] if r.responses and r.responses[0] else None
            if held is None or held.lease != lease:
                raise NodeIdTakenError(
                    f"node id {node.node_id} is registered already by a live node "
                    f"({held.value.decode(errors='replace') if held else '?'}): each node of a "
                    "cluster needs its own --node-id"
                )
            await self.etcd.put(key, _enc.encode(node), lease=lease)

    async def create_topic(
        self, topic: TopicInfo, assignment: Sequence[Sequence[int]], fence: Fence | None
    ) -> bool:
        """Create the topic and its partitions' states (first replica leads, all in sync) at
        once; False when it exists already."""
        if len(assignment) != topic.partitions:
            raise ValueError(f"{len(assignment)} replica sets for {topic.partitions} partitions")
        ops = [Op.put(self.topic_key(topic.name), _enc.encode(topic))]
        for p, replicas in enumerate(assignment):
            state = PartitionState(tuple(replicas), replicas[0], 0, tuple(replicas))
            ops.append(Op.put(self.partition_key(topic.name, p), _enc.encode(state)))
        compares = [Compare.create_revision(self.topic_key(topic.name), "=", 0)]
        if fence is not None:
            compares.append(fence.compare())
        return (await self.etcd.txn(compares, ops)).succeeded

    async def set_partition(
        self,
        topic: str,
        partition: int,
        state: PartitionState,
        expect_version: int,
        fence: Fence | None = None,
    ) -> bool:
        """Replace a partition's state if it is still at ``expect_version`` (the
        ``mod_revision`` the writer read) and, for a controller, its fence still holds."""
        key = self.partition_key(topic, partition)
        compares = [Compare.mod_revision(key, "=", expect_version)]
        if fence is not None:
            compares.append(fence.compare())
        return (await self.etcd.txn(compares, [Op.put(key, _enc.encode(state))])).succeeded

    async def start_reassignments(
        self,
        topic: str,
        topic_version: int,
        targets: Mapping[int, Sequence[int]],
        originals: Mapping[int, Sequence[int]] | None = None,
    ) -> int | None:
        """Write the target replica sets of partitions of ``topic`` (with their replica
        sets now, ``originals``, for a cancel) if the topic is still at ``topic_version``
        and none of these partitions is being moved already. Returns the revision written
        at, None when refused."""
        compares = [Compare.mod_revision(self.topic_key(topic), "=", topic_version)]
        ops = []
        for p, target in sorted(targets.items()):
            rkey = self.reassign_key(topic, p)
            compares.append(Compare.create_revision(rkey, "=", 0))
            original = tuple((originals or {}).get(p, ()))
            ops.append(Op.put(rkey, _enc.encode(Reassignment(tuple(target), original))))
        r = await self.etcd.txn(compares, ops)
        return r.revision if r.succeeded else None

    async def finish_reassignment(
        self,
        topic: str,
        partition: int,
        state: PartitionState,
        expect_version: int,
        fence: Fence | None,
    ) -> bool:
        """The last change of a move: the partition's state (on its target replicas) and the
        end of its reassignment, at once; compared as :meth:`set_partition` compares."""
        key = self.partition_key(topic, partition)
        compares = [Compare.mod_revision(key, "=", expect_version)]
        if fence is not None:
            compares.append(fence.compare())
        ops = [Op.put(key, _enc.encode(state)), Op.delete(self.reassign_key(topic, partition))]
        return (await self.etcd.txn(compares, ops)).succeeded

    async def set_replication_factor(
        self,
        topic: TopicInfo,
        topic_version: int,
        partition_versions: Mapping[int, int],
        fence: Fence | None,
    ) -> bool:
        """Write a topic's entry (its replication factor, once every partition has that many
        replicas) if the entry and each of its partitions are still at the versions the
        writer read them at (so that the count it saw is etcd's)."""
        compares = [Compare.mod_revision(self.topic_key(topic.name), "=", topic_version)]
        for p, version in sorted(partition_versions.items()):
            compares.append(Compare.mod_revision(self.partition_key(topic.name, p), "=", version))
        if fence is not None:
            compares.append(fence.compare())
        ops = [Op.put(self.topic_key(topic.name), _enc.encode(topic))]
        return (await self.etcd.txn(compares, ops)).succeeded

    async def alter_topic(
        self,
        topic: TopicInfo,
        topic_version: int,
        new_partitions: Mapping[int, Sequence[int]],
    ) -> bool:
        """Replace a topic's entry (settings, partition count) if it is still at
        ``topic_version``, creating the states of its new partitions (first replica leads at
        epoch 0, all in sync); False when the topic changed meanwhile."""
        tkey = self.topic_key(topic.name)
        compares = [Compare.mod_revision(tkey, "=", topic_version)]
        ops = [Op.put(tkey, _enc.encode(topic))]
        for p, replicas in sorted(new_partitions.items()):
            pkey = self.partition_key(topic.name, p)
            compares.append(Compare.create_revision(pkey, "=", 0))
            state = PartitionState(tuple(replicas), replicas[0], 0, tuple(replicas))
            ops.append(Op.put(pkey, _enc.encode(state)))
        return (await self.etcd.txn(compares, ops)).succeeded

    async def delete_topic(self, name: str, fence: Fence | None) -> bool:
        compares = [Compare.create_revision(self.topic_key(name), ">", 0)]
        if fence is not None:
            compares.append(fence.compare())
        ops = [
            Op.delete(self.topic_key(name)),
            Op.delete(f"{self.root}partitions/{name}/", prefix=True),
            Op.delete(f"{self.root}reassign/{name}/", prefix=True),
        ]
        return (await self.etcd.txn(compares, ops)).succeeded


class MetadataCache:
    """A node's copy of the metadata: read at one revision, then kept current by a watch.

    ``on_change(kind, key, value)`` is called for each change applied (``kind`` one of
    ``node``, ``topic``, ``partition``; ``value`` None for a deletion). While etcd cannot be
    reached the copy stays as it was (data keeps flowing on current leaders) and the watch is
    resumed from the next revision, or everything is read anew after a compaction.
    """

    def __init__(
        self,
        store: MetadataStore,
        on_change: Callable[[str, str, object | None], None] | None = None,
        *,
        retry_s: float = 0.5,
    ) -> None:
        self.store = store
        self.on_change = on_change
        self.retry_s = retry_s
        self.nodes: dict[int, NodeInfo] = {}
        self.topics: dict[str, TopicInfo] = {}
        #: topic -> the version (mod_revision) of its entry
        self.topic_versions: dict[str, int] = {}
        #: (topic, partition) -> its state and version (the key's mod_revision)
        self._partitions: dict[tuple[str, int], tuple[PartitionState, int]] = {}
        #: (topic, partition) -> the target replicas of a move under way
        self.reassignments: dict[tuple[str, int], tuple[int, ...]] = {}
        #: (topic, partition) -> the replicas it had when that move started (() unknown)
        self.reassignment_origins: dict[tuple[str, int], tuple[int, ...]] = {}
        #: the controller election's candidates: key -> (create revision, node id)
        self._candidates: dict[str, tuple[int, int]] = {}
        #: producer id -> the largest epoch a node recorded (``producer-epochs/``)
        self.producer_epochs: dict[int, int] = {}
        #: transient queue -> the node that declared and serves it (``transient-queues/``,
        #: on that node's lease: tidewire.cluster.queues), and its settings (JSON)
        self.transient_queues: dict[str, int] = {}
        self.transient_specs: dict[str, bytes] = {}
        self.revision = 0
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def partition(self, topic: str, partition: int) -> tuple[PartitionState, int] | None:
        """The partition's state and its version, None when unknown."""
        return self._partitions.get((topic, partition))

    def partitions(self) -> dict[tuple[str, int], tuple[PartitionState, int]]:
        return dict(self._partitions)

    @property
    def controller(self) -> int:
        """The node that is the controller, as this copy knows it (-1: none). An etcd
        election's leader is its candidate key of the lowest create revision."""
        if not self._candidates:
            return -1
        return min(self._candidates.values())[1]

    async def load(self) -> None:
        kvs, rev = await self.store.etcd.range(self.store.root, prefix=True)
        self.nodes.clear()
        self.topics.clear()
        self.topic_versions.clear()
        self._partitions.clear()
        self.reassignments.clear()
        self.reassignment_origins.clear()
        self._candidates.clear()
        self.transient_queues.clear()
        self.transient_specs.clear()
        for kv in kvs:
            self._apply(kv, deleted=False)
        self.revision = rev
        self.changed.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name="metadata watch")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float | None) -> None:
        """Until ``predicate()`` holds over the copy (checked after each change; no limit
        when ``timeout_s`` is None). Decided on the predicate, not on :attr:`changed` alone,
        so that it may be started as a task: the event is shared and each waiter clears it
        once it has looked."""
        async with asyncio.timeout(timeout_s):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

    async def _follow(self) -> None:
        while True:
            try:
                async for events in self.store.etcd.watch(
                    self.store.root, prefix=True, start_revision=self.revision + 1
                ):
                    for e in events:
                        self._apply(e.kv, deleted=e.type == "DELETE")
                        self.revision = max(self.revision, e.kv.mod_revision)
                    self.changed.set()
            except WatchCompactedError:
                log.info("metadata watch compacted: reading it anew")
                with contextlib.suppress(EtcdUnavailableError):
                    await self.load()
                continue
            except EtcdUnavailableError as exc:
                log.warning("metadata watch interrupted (%s); resuming", exc)
            await asyncio.sleep(self.retry_s)

    def _apply(self, kv: KeyValue, *, deleted: bool) -> None:
        rel = kv.key.decode()[len(self.store.root) :]
        kind, _, rest = rel.partition("/")
        value: object | None = None
        if kind == "nodes":
            nid = int(rest)
            if deleted:
                self.nodes.pop(nid, None)
            else:
                value = self.nodes[nid] = msgspec.json.decode(kv.value, type=NodeInfo)
        elif kind == "topics":
            if deleted:
                self.topics.pop(rest, None)
                self.topic_versions.pop(rest, None)
            else:
                value = self.topics[rest] = msgspec.json.decode(kv.value, type=TopicInfo)
                self.topic_versions[rest] = kv.mod_revision
        elif kind == "partitions":
            topic, _, p = rest.rpartition("/")
            key = (topic, int(p))
            if deleted:
                self._partitions.pop(key, None)
            else:
                state = msgspec.json.decode(kv.value, type=PartitionState)
                self._partitions[key] = (state, kv.mod_revision)
                value = state
        elif kind == "reassign":
            topic, _, p = rest.rpartition("/")
            if deleted:
                self.reassignments.pop((topic, int(p)), None)
                self.reassignment_origins.pop((topic, int(p)), None)
            else:
                r = msgspec.json.decode(kv.value, type=Reassignment)
                self.reassignments[(topic, int(p))] = r.target
                self.reassignment_origins[(topic, int(p))] = r.original
            if self.on_change is not None:
                self.on_change("reassignment", rest, None if deleted else r)
            return
        elif kind == "producer-epochs":
            pid, _, epoch = rest.partition("/")
            try:
                got = (int(pid), int(epoch))
            except ValueError:
                log.warning("producer epoch key %s names no producer id and epoch", rest)
                return
            if not deleted and got[1] > self.producer_epochs.get(got[0], -1):
                self.producer_epochs[got[0]] = got[1]
                if self.on_change is not None:
                    self.on_change("producer-epoch", rest, got)
            return  # an expired bump: the nodes keep fencing until the producer expires
        elif kind == "transient-queues":
            if deleted:
                self.transient_queues.pop(rest, None)
                self.transient_specs.pop(rest, None)
            else:
                try:
                    record = msgspec.json.decode(kv.value, type=TransientQueueRecord)
                except msgspec.DecodeError:
                    log.warning("transient queue %s: not a record: %r", rest, kv.value)
                    return
                self.transient_queues[rest] = record.node
                self.transient_specs[rest] = bytes(record.spec)
            return
        elif kind == "controller":
            if deleted:
                self._candidates.pop(rest, None)
            else:
                try:
                    self._candidates[rest] = (kv.create_revision, int(kv.value))
                except ValueError:
                    log.warning("controller candidate %s names no node: %r", rest, kv.value)
            return
        else:
            return  # anything newer
        if self.on_change is not None:
            self.on_change(kind[:-1], rest, value)
