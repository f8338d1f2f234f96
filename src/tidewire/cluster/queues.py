"""Queues and exchanges of a cluster: replicated definitions, and an owner per durable queue.

- **Definitions** (exchanges, queues, bindings) are ``__queue_definitions``, one partition of
  an internal topic replicated on every live node (each node routes publishes through the
  exchanges, so each holds a copy; the log is small), made through etcd by the first change,
  this node first in its replicas so that it leads at epoch 0 and its local log (its own
  definitions) becomes the cluster's, as ``__security`` is made
  (:mod:`tidewire.cluster.security`). A change is made on the leader only (another node
  answers NotLeaderError naming it: clients ask the nodes in turn, the HTTP API redirects),
  refused below ``min_insync_replicas`` and answered once every in-sync replica holds it;
  every replica applies what it copies (``Broker.replica_appended``).
- **A durable queue** ``Q`` has the topic ``__queue.Q`` of two partitions (0: its messages,
  1: its delivery state; :mod:`tidewire.broker.queues.store`), created through etcd when the
  queue is declared (on ``min(default replication factor, live nodes)`` nodes, both
  partitions on the same replicas in the same order, so the same node is elected for both)
  and deleted through etcd when it is deleted. Its **owner** is the leader of partition 0; the
  controller moves the leadership of partition 1 to it whenever they differ and it is an
  in-sync replica of partition 1 (:func:`follow_owner`), so the owner leads both. The node
  leading both loads the queue from its replicas (:meth:`QueueManager.cluster_role`) and
  serves it; it gives the queue up as soon as it stops leading either (its consumers are
  told they were cancelled, and what they held is delivered again by the next owner: at
  least once). Publishes are confirmed, and acks and settles answered, once every in-sync
  replica holds them (refused below ``min_insync_replicas``).
- **Other nodes** answer a queue operation with NotLeaderError naming the owner (the Python
  client routes to the leader of ``__queue.Q`` partition 0); a publish through an exchange
  whose bindings reach queues served elsewhere is forwarded, part by part, to their owners
  through the default exchange (:meth:`ClusterQueues.forward`), and confirmed once every part
  is. Dead letters and replays take the same way.
- **Deleting a durable queue** changes the definitions, so it is done by the leader of
  ``__queue_definitions``; its ``if_empty`` / ``if_unused`` conditions are about what the
  owner holds, so when the queue is served elsewhere that leader asks the owner for its
  counts first (:meth:`ClusterQueues.owner_usage`, LIST_QUEUES as this node). An
  ``auto_delete`` queue whose last consumer left its owner is deleted by the owner sending
  the delete, ``if_unused``, to that leader (:meth:`ClusterQueues.delete_at_definitions_leader`):
  a consumer that came meanwhile keeps it. That request names the owner
  (``auto_delete_by``): it is the cluster's own (``cluster_action``, not ``delete`` on the
  queue, which the node principal does not hold), and the leader deletes so only an
  ``auto_delete`` queue that node owns, unused (``QueueManager.delete_for_owner``).
- **A transient queue** (not durable, not exclusive) is served by the node that declared
  it, which records itself as its owner in etcd (:data:`TRANSIENT_QUEUES`, a key on its
  lease: gone with the node, as the queue's in-memory messages are; put again when the node
  registers on a new lease). Every node's copy of the metadata follows these records, so
  the others answer NotLeaderError naming the owner, METADATA describes ``__queue.<name>``
  as led by it (:meth:`ClusterQueues.transient_metadata`: clients route there as for a
  durable queue) and publishes through exchanges are forwarded to it. An exclusive queue
  stays on its connection's node, unrecorded: only that connection may use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from typing import TYPE_CHECKING

import msgspec

from tidewire.broker.queues.definitions import DEFINITIONS_TOPIC, definitions_config
from tidewire.broker.queues.model import DEFAULT_EXCHANGE, QueueSpec
from tidewire.broker.queues.store import QUEUE_TOPIC_PREFIX, message_config, queue_topic
from tidewire.cluster.etcd import Compare, EtcdError, Op
from tidewire.cluster.fetcher import ReplicaLink, default_connect
from tidewire.cluster.metadata import PartitionState, TopicInfo, TransientQueueRecord
from tidewire.errors import (
    NotEnoughReplicasError,
    NotLeaderError,
    RequestTimedOutError,
    TidewireError,
    UnknownQueueError,
    for_code,
)
from tidewire.protocol.messages import (
    Body,
    ListQueuesRequest,
    PartitionInfo,
    QueueDeleteRequest,
    QueuePublishRequest,
    TopicConfig,
    TopicDescription,
)
from tidewire.storage.fs import write_atomic

if TYPE_CHECKING:
    from tidewire.cluster.node import ClusterNode

__all__ = ["FORWARD_TIMEOUT_S", "TRANSIENT_QUEUES", "ClusterQueues", "follow_owner", "queue_of"]

log = logging.getLogger("tidewire.cluster.queues")

_DEFS = (DEFINITIONS_TOPIC, 0)
#: The etcd keys (under the cluster's root) of the transient queues' owners: ``<name>`` ->
#: the node id, on that node's lease (:meth:`ClusterQueues.claim_transient`).
TRANSIENT_QUEUES = "transient-queues"
#: How long a forwarded publish keeps looking for the queue's owner (a failover under way
#: names a new one within the session timeout) before the publish fails.
FORWARD_TIMEOUT_S = 30.0
#: Pause between two attempts of a forward whose owner moved or was not known.
_FORWARD_RETRY_S = 0.2
#: How long the leader of the definitions waits for a queue's owner's counts, and an owner
#: for that leader to delete an ``auto_delete`` queue, before giving up (s).
ASK_TIMEOUT_S = 5.0


def _record(node_id: int, spec: QueueSpec) -> bytes:
    """The value of transient queue ``spec``'s etcd key (see :class:`TransientQueueRecord`)."""
    return msgspec.json.encode(
        TransientQueueRecord(node_id, msgspec.Raw(msgspec.json.encode(spec)))
    )


def queue_of(topic: str) -> str | None:
    """The durable queue whose topic ``topic`` is, or None."""
    return topic[len(QUEUE_TOPIC_PREFIX) :] if topic.startswith(QUEUE_TOPIC_PREFIX) else None


def follow_owner(
    topic: str, partition: int, state: PartitionState, owner: PartitionState | None, live: set[int]
) -> PartitionState | None:
    """The controller's rule for a queue's state partition (1): led by its owner, the leader
    of partition 0 (``owner``), when that node is live and in partition 1's ISR, at the next
    epoch. None: nothing to change."""
    if partition != 1 or queue_of(topic) is None or owner is None:
        return None
    lead = owner.leader
    if lead == state.leader or lead not in live or lead not in state.isr:
        return None
    return PartitionState(state.replicas, lead, state.leader_epoch + 1, state.isr)


class _Partition:
    """One partition of a queue's topic as the queue's log writes it: on its leader, with
    ``acks=all`` rules."""

    def __init__(self, node: ClusterNode, topic: str, partition: int) -> None:
        self._node = node
        self._key = (topic, partition)

    def check_leader(self) -> None:
        rep = self._node.broker.replication
        if rep is None:
            raise NotLeaderError(f"node {self._node.node_id} does not replicate yet")
        leader = rep.check_leader(*self._key)
        if not leader.can_append_acks_all():
            raise NotEnoughReplicasError(
                f"{self._key[0]}/{self._key[1]}: {len(leader.isr)} in-sync replica(s) "
                f"{sorted(leader.isr)}, min_insync_replicas is {leader.min_insync}; "
                "nothing was stored"
            )

    async def wait_replicated(self, end: int) -> None:
        broker = self._node.broker
        rep = broker.replication
        if rep is None:
            raise NotLeaderError(f"{self._key[0]} is not led here")
        broker._wake(*self._key)  # followers waiting in a fetch take it at once
        await rep.wait_replicated(self._key[0], self._key[1], end, rep.ack_timeout_s)


class _Definitions:
    """``__queue_definitions`` as the definition store writes it in the cluster."""

    def __init__(self, node: ClusterNode, queues: ClusterQueues) -> None:
        self._node = node
        self._queues = queues

    async def check_leader(self) -> None:
        from tidewire.cluster.security import check_led_here  # noqa: PLC0415 (a cycle)

        await check_led_here(
            self._node,
            DEFINITIONS_TOPIC,
            self._queues.ensure_definitions_topic,
            "exchanges, queues and bindings are declared and deleted",
        )

    async def wait_replicated(self, end: int) -> None:
        await _Partition(self._node, *_DEFS).wait_replicated(end)


class ClusterQueues:
    """The queues' side of cluster node ``node`` (see the module docstring); a
    :class:`~tidewire.broker.queues.manager.QueueCluster`."""

    def __init__(self, node: ClusterNode) -> None:
        self._node = node
        self._definitions = _Definitions(node, self)
        self._links: dict[tuple[str, int], ReplicaLink] = {}
        #: transient queues declared here whose owner record this node put in etcd
        self._transient: dict[str, QueueSpec] = {}

    def definitions(self) -> _Definitions:
        return self._definitions

    def log_replication(self, topic: str, partition: int) -> _Partition:
        return _Partition(self._node, topic, partition)

    def owns(self, name: str) -> bool:
        rep = self._node.broker.replication
        if rep is None:
            return False
        topic = queue_topic(name)
        try:
            rep.check_leader(topic, 0)
            rep.check_leader(topic, 1)
        except NotLeaderError:
            return False
        return True

    def owner_of(self, name: str) -> int:
        got = self._node.cache.partition(queue_topic(name), 0)
        if got is not None:
            return got[0].leader
        return self._node.cache.transient_queues.get(name, -1)

    def not_owner(self, name: str) -> NotLeaderError:
        node = self._node
        topic = queue_topic(name)
        if node.cache.partition(topic, 0) is None and name in node.cache.transient_queues:
            return self._transient_elsewhere(name, node.cache.transient_queues[name])
        got = node.cache.partition(topic, 0)
        leader = got[0].leader if got is not None else -1
        info = node.cache.nodes.get(leader)
        if leader == node.node_id or info is None:
            return NotLeaderError(
                f"queue {name!r} is not served by node {node.node_id} yet (its owner, the "
                f"leader of {topic} partition 0, is taking it over or not known); try again"
            )
        return NotLeaderError(
            f"queue {name!r} is served by its owner, node {leader} at {info.host}:{info.port} "
            f"(the leader of {topic} partition 0), not by node {node.node_id}",
            leader_id=leader,
            leader_host=info.host,
            leader_port=info.port,
        )

    # --- topics through etcd --------------------------------------------------------------------

    async def ensure_definitions_topic(self) -> None:
        """Create ``__queue_definitions`` through etcd on every live node, this node first
        (its leader at epoch 0) and its local log adopted as the cluster's; another node that
        got there first wins the compare-and-swap.

        Raises:
            RequestTimedOutError: etcd did not answer.
        """
        node = self._node
        live = sorted(node.cache.nodes)
        if node.node_id not in live:
            raise RequestTimedOutError(f"node {node.node_id} is not registered in its cluster")
        from tidewire.cluster.controller import assign  # noqa: PLC0415 (imports this module)

        (replicas,) = assign(1, len(live), live, live.index(node.node_id))
        try:
            if await node.etcd.get(node.store.topic_key(DEFINITIONS_TOPIC)) is not None:
                return
        except EtcdError as exc:
            raise RequestTimedOutError(f"{DEFINITIONS_TOPIC} not created: {exc}") from None
        from tidewire.cluster.node import TOPIC_ID_FILE, config_to_strings  # noqa: PLC0415

        topic_id = uuid.uuid4().hex
        cfg = definitions_config()
        logs = node.broker.logs
        plog = logs.logs.get(_DEFS)
        if plog is None:
            plog = logs.create_log(DEFINITIONS_TOPIC, 0, cfg)
        await asyncio.to_thread(
            write_atomic, logs.fs, f"{plog.directory}/{TOPIC_ID_FILE}", topic_id.encode()
        )
        info = TopicInfo(DEFINITIONS_TOPIC, 1, len(live), config_to_strings(cfg), topic_id)
        try:
            created = await node.store.create_topic(info, [replicas], None)
        except EtcdError as exc:
            raise RequestTimedOutError(f"{DEFINITIONS_TOPIC} not created: {exc}") from None
        if created:
            log.info("created %s: replicas %s", DEFINITIONS_TOPIC, list(replicas))

    async def create_queue_topic(self, name: str) -> None:
        """Create ``__queue.<name>`` through etcd (see the module docstring); answered once
        this node's copy of the metadata has it. Nothing when it exists.

        Raises:
            InvalidTopicError: no live node; RequestTimedOutError: etcd did not answer.
        """
        node = self._node
        topic = queue_topic(name)
        if topic in node.cache.topics:
            return
        live = sorted(node.cache.nodes)
        rf = min(node.default_replication_factor, len(live))
        from tidewire.cluster.controller import assign  # noqa: PLC0415 (imports this module)

        (replicas,) = assign(1, rf, live, random.randrange(max(1, len(live))))
        from tidewire.cluster.node import config_to_strings  # noqa: PLC0415

        info = TopicInfo(topic, 2, rf, config_to_strings(message_config()), uuid.uuid4().hex)
        try:
            created = await node.store.create_topic(info, [replicas, list(replicas)], None)
        except EtcdError as exc:
            raise RequestTimedOutError(f"{topic} not created: {exc}") from None
        if created:
            log.info("queue %r: created %s on replicas %s", name, topic, replicas)
        await node._await_local(
            f"{topic} was created in the cluster, but node {node.node_id} did not see it",
            lambda: topic in node._seen_topics,
        )

    async def delete_queue_topic(self, name: str) -> None:
        """Delete ``__queue.<name>`` through etcd (every replica deletes its logs as its copy
        of the metadata sees it). Nothing when it does not exist.

        Raises:
            RequestTimedOutError: etcd did not answer.
        """
        node = self._node
        topic = queue_topic(name)
        try:
            deleted = await node.store.delete_topic(topic, None)
        except EtcdError as exc:
            raise RequestTimedOutError(f"{topic} not deleted: {exc}") from None
        if deleted:
            log.info("queue %r: deleted %s", name, topic)

    # --- transient queues ------------------------------------------------------------------------

    def transient_key(self, name: str) -> str:
        """The etcd key naming transient queue ``name``'s owner."""
        return f"{self._node.store.root}{TRANSIENT_QUEUES}/{name}"

    def transient_owner(self, name: str) -> int:
        """The node that declared transient queue ``name`` and serves it, when it is another
        node (-1: none, or this node), as this node's copy of the metadata has it."""
        owner = self._node.cache.transient_queues.get(name, -1)
        return -1 if owner == self._node.node_id else owner

    def transient_specs(self) -> dict[str, QueueSpec]:
        """The transient queues other nodes declared and serve: their settings, by name."""
        cache = self._node.cache
        out: dict[str, QueueSpec] = {}
        for name, raw in cache.transient_specs.items():
            if cache.transient_queues.get(name) == self._node.node_id:
                continue
            try:
                out[name] = msgspec.json.decode(raw, type=QueueSpec)
            except msgspec.ValidationError:
                log.warning("transient queue %r: its recorded settings are not readable", name)
        return out

    def _transient_elsewhere(self, name: str, owner: int) -> NotLeaderError:
        node = self._node
        info = node.cache.nodes.get(owner)
        where = f" at {info.host}:{info.port}" if info is not None else ""
        return NotLeaderError(
            f"queue {name!r} (transient) is served by the node that declared it, node "
            f"{owner}{where}, not by node {node.node_id}",
            leader_id=owner,
        )

    async def claim_transient(self, spec: QueueSpec) -> None:
        """Record this node as the owner of transient queue ``name``, declared here: an etcd
        key on this node's lease, so that the other nodes route its requests here and the
        record goes with the node (its messages, in memory, go with it too). Nothing when
        this node holds it already.

        Raises:
            NotLeaderError: another node serves a transient queue of that name (named);
            RequestTimedOutError: etcd did not answer (nothing declared).
        """
        name = spec.name
        node = self._node
        key = self.transient_key(name)
        mine = _record(node.node_id, spec)
        try:
            r = await node.etcd.txn(
                [Compare.create_revision(key, "=", 0)],
                [Op.put(key, mine, node.lease.id)],
                [Op.get(key)],
            )
            if not r.succeeded:
                held = r.responses[0][0] if r.responses and r.responses[0] else None
                holder = -1
                if held is not None:
                    with contextlib.suppress(msgspec.DecodeError):
                        holder = msgspec.json.decode(held.value, type=TransientQueueRecord).node
                if holder != node.node_id:
                    raise self._transient_elsewhere(name, holder)
                if held is not None and held.lease != node.lease.id:  # registered again
                    await node.etcd.put(key, mine, lease=node.lease.id)
        except EtcdError as exc:
            raise RequestTimedOutError(
                f"transient queue {name!r} not declared: etcd did not answer ({exc})"
            ) from None
        self._transient[name] = spec

    async def reclaim_transients(self) -> None:
        """After this node registered again on a new lease (the records on its lost one are
        gone with it): put the records of the transient queues it still serves again. A
        name another node declared meanwhile stays that node's (logged): the queue here is
        then reachable through this node only."""
        for name, spec in sorted(self._transient.items()):
            del self._transient[name]
            try:
                await self.claim_transient(spec)
            except TidewireError as exc:
                log.warning("transient queue %r: not recorded as this node's again: %s", name, exc)

    async def release_transient(self, name: str) -> None:
        """Transient queue ``name``, declared here, is deleted: its record goes (a record
        left by etcd not answering goes with this node's lease)."""
        spec = self._transient.pop(name, None)
        if spec is None:
            return
        node = self._node
        key = self.transient_key(name)
        try:
            await node.etcd.txn(
                [Compare.value_is(key, "=", _record(node.node_id, spec))], [Op.delete(key)]
            )
        except EtcdError as exc:
            log.warning("transient queue %r: its owner record not deleted: %s", name, exc)

    def transient_metadata(self, topic: str) -> TopicDescription | None:
        """The METADATA answer for ``__queue.<name>`` of a transient queue (None: not one):
        its two partitions "led" by its owner, so that clients route its requests there as
        they route a durable queue's (:mod:`tidewire.client._queues`)."""
        name = queue_of(topic)
        owner = -1 if name is None else self._node.cache.transient_queues.get(name, -1)
        if owner < 0:
            return None
        parts = [
            PartitionInfo(
                partition=p,
                log_start_offset=-1,
                log_end_offset=-1,
                high_watermark=-1,
                size_bytes=0,
                leader=owner,
                leader_epoch=0,
                replicas=[owner],
                isr=[owner],
            )
            for p in (0, 1)
        ]
        return TopicDescription(
            name=topic,
            partitions=parts,
            config=TopicConfig(),
            replication_factor=1,
            min_insync_replicas=1,
        )

    # --- deleting a queue served elsewhere -----------------------------------------------------

    async def _ask(self, node_id: int, request: Body, what: str) -> Body:
        """``request`` answered by node ``node_id`` (sent as this node, on the link that
        forwards to it) within :data:`ASK_TIMEOUT_S`: its answer's body, its error raised.

        Raises:
            NotLeaderError: the node is not registered now; RequestTimedOutError: it did not
                answer in time; TidewireError: its error.
        """
        node = self._node
        info = node.cache.nodes.get(node_id)
        if info is None:
            raise NotLeaderError(f"{what}: node {node_id} is not registered now; try again")
        link = self._link(info.host, info.port)
        try:
            async with asyncio.timeout(ASK_TIMEOUT_S):
                response = await link.request(request, timeout_s=ASK_TIMEOUT_S)
        except TimeoutError:
            raise RequestTimedOutError(
                f"{what}: node {node_id} did not answer within {ASK_TIMEOUT_S:g} s"
            ) from None
        body: Body = response.body
        code = int(getattr(body, "error_code", 0))
        if code:
            raise for_code(code)(str(getattr(body, "error_message", "")))
        return body

    async def owner_usage(self, name: str) -> tuple[int, int]:
        """Durable queue ``name``'s messages not settled (ready, delivered, delayed) and its
        consumers, as its owner (another node) counts them now: asked of it.

        Raises:
            NotLeaderError: it has no owner now, or its owner does not serve it yet (try
                again); RequestTimedOutError: the owner did not answer in time.
        """
        node = self._node
        got = node.cache.partition(queue_topic(name), 0)
        owner = got[0].leader if got is not None else -1
        if owner < 0 or owner == node.node_id:
            raise self.not_owner(name)
        what = f"queue {name!r} not checked (if_empty / if_unused)"
        body = await self._ask(owner, ListQueuesRequest(), what)
        for info in getattr(body, "queues", ()):
            if info.name == name:
                return info.ready + info.unacked + info.delayed, info.consumers
        raise NotLeaderError(
            f"{what}: its owner, node {owner}, does not list it (taking it over, or not "
            "allowed to describe it); try again"
        )

    async def delete_at_definitions_leader(self, name: str) -> None:
        """Have the leader of ``__queue_definitions`` delete durable queue ``name`` if it has
        no consumers (``if_unused``, checked with this node, its owner): an ``auto_delete``
        queue whose last consumer left. Sent again on a retriable failure (that leader moving
        or not answering) for up to :data:`FORWARD_TIMEOUT_S`.

        Raises:
            PreconditionFailedError: a consumer came meanwhile; NotLeaderError,
                RequestTimedOutError: no other node leading the definitions took it.
        """
        node = self._node
        what = f"queue {name!r} (auto_delete) not deleted"
        deadline = time.monotonic() + FORWARD_TIMEOUT_S
        while True:
            got = node.cache.partition(DEFINITIONS_TOPIC, 0)
            leader = got[0].leader if got is not None else -1
            if leader == node.node_id:
                raise NotLeaderError(f"{what}: this node leads {DEFINITIONS_TOPIC} now")
            try:
                if leader < 0:
                    raise NotLeaderError(f"{what}: {DEFINITIONS_TOPIC} has no leader now")
                request = QueueDeleteRequest(name=name, if_unused=True, auto_delete_by=node.node_id)
                await self._ask(leader, request, what)
                return
            except TidewireError as exc:
                if not exc.retriable or time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(_FORWARD_RETRY_S)

    # --- forwarding -----------------------------------------------------------------------------

    async def forward(self, queue: str, data: bytes, *, ttl_ms: int, deliver_at_ms: int) -> None:
        """Publish ``data`` (checked record batches) to queue ``queue`` on its owner (of a
        durable queue; of a transient one, the node that declared it) through the default
        exchange, as this node (its TLS and credentials, as its replica
        fetchers connect); return once the owner confirmed it. Sent again while the owner
        moves, for up to :data:`FORWARD_TIMEOUT_S` (a publish whose connection was lost may
        then be stored twice: queues deliver at least once).

        Raises:
            TidewireError: the owner refused it (not retriable), or none took it in time.
        """
        node = self._node
        topic = queue_topic(queue)
        deadline = time.monotonic() + FORWARD_TIMEOUT_S
        request = QueuePublishRequest(
            exchange=DEFAULT_EXCHANGE,
            routing_key=queue,
            mandatory=True,
            ttl_ms=ttl_ms,
            deliver_at_ms=deliver_at_ms,
        )
        transient = topic not in node.cache.topics and queue in node.cache.transient_queues
        while True:
            failure: TidewireError
            if transient and queue not in node.cache.transient_queues:
                raise UnknownQueueError(
                    f"no queue {queue!r}: the node of that transient queue is gone, or it "
                    "was deleted"
                )
            leader = self.owner_of(queue)
            address = node.cache.nodes.get(leader)
            if leader == node.node_id or address is None:
                failure = self.not_owner(queue)
            else:
                link = self._link(address.host, address.port)
                try:
                    response = await link.request(request, [data])
                    body = response.body
                    if not body.error_code:
                        return
                    failure = for_code(body.error_code)(body.error_message)
                except TidewireError as exc:
                    failure = exc
                if not failure.retriable:
                    raise failure
            if time.monotonic() >= deadline:
                raise failure
            await asyncio.sleep(_FORWARD_RETRY_S)

    def _link(self, host: str, port: int) -> ReplicaLink:
        """The connection that forwards to the node at ``host:port``, made on first use as
        this node's replica fetchers connect (its TLS and credentials) and kept until
        :meth:`close`."""
        link = self._links.get((host, port))
        if link is None:
            connect = self._node.replica_connect or default_connect
            link = self._links[host, port] = connect(host, port)
        return link

    async def close(self) -> None:
        """Close the connections made for forwarding."""
        links, self._links = list(self._links.values()), {}
        for link in links:
            try:
                await link.close()
            except TidewireError as exc:
                log.debug("forwarding link not closed cleanly: %s", exc)


async def include_new_nodes(node: ClusterNode) -> bool:
    """On the leader of ``__queue_definitions``: keep it on every live node, as
    ``__security`` is (:func:`tidewire.cluster.security.include_every_node`), so that every
    node knows every queue. False: to be tried again at the next pass."""
    from tidewire.cluster.security import include_every_node  # noqa: PLC0415 (a cycle)

    return await include_every_node(node, DEFINITIONS_TOPIC, "every node knows the queues")


async def check_definitions_incarnation(node: ClusterNode, info: TopicInfo) -> bool:
    """A local ``__queue_definitions`` that is not of the cluster's incarnation (the node's
    own definitions from before it joined) is replaced by a copy of the cluster's, as
    ``__security`` is. False: something is left for the next pass."""
    from tidewire.cluster.security import replace_own_copy  # noqa: PLC0415 (a cycle)

    return await replace_own_copy(
        node,
        DEFINITIONS_TOPIC,
        info,
        "the queue definitions here",
        node.broker.queues.definitions_truncated,
    )
