"""Lightweight streams in a cluster: ``__streams`` as a replicated topic, a stream's owner the
leader of its partition.

On a single node the stream manager (:class:`~tidewire.broker.streams.manager.StreamManager`)
keeps ``__streams`` as its own logs. In a cluster, the way the consumer groups'
``__consumer_offsets`` is kept:

- **Made on first use.** The first stream request any node gets (or the first METADATA asking
  for ``__streams``: clients ask when they look for a stream's owner) creates the topic through
  etcd, with the node's ``stream_partitions`` partitions and ``__streams`` log settings, on
  ``min(--default-replication-factor, live nodes)`` nodes; several nodes may try at once and
  etcd's compare-and-swap keeps the first. Start every node before the first stream is used.
- **The owner serves.** A stream's partition is :func:`~tidewire.broker.streams.model.
  partition_of` its id over the topic's partition count; the leader of that partition is the
  stream's owner. The node's reconcile pass calls :func:`streams_role` when this node starts
  or stops leading a partition: the manager indexes it from the local replica
  (``take_over``) or forgets its streams (``give_up``). Any other node answers
  :class:`~tidewire.errors.NotLeaderError` naming the leader; the Python client routes by
  partition (``client/_streams.py``) and the HTTP gateways forward or redirect
  (:meth:`ClusterStreams.forwarder`).
- **Acknowledged once replicated.** A persistent send and a receive's take record are
  answered once every in-sync replica holds them, refused below ``min_insync_replicas``; a
  read sees only what is below the partition's high watermark. In-memory messages live on
  the owner only: they are lost with it, as they are with a single node's restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import TYPE_CHECKING, cast

from tidewire.broker.offsets import STREAMS_TOPIC
from tidewire.cluster.controller import assign
from tidewire.cluster.etcd import EtcdError
from tidewire.cluster.fetcher import default_connect
from tidewire.cluster.metadata import TopicInfo
from tidewire.errors import (
    InvalidRequestError,
    NotEnoughReplicasError,
    NotLeaderError,
    RequestTimedOutError,
    TidewireError,
)

if TYPE_CHECKING:
    from tidewire.client._routing import Router
    from tidewire.client._streams import AsyncStreams
    from tidewire.client._transport import Transport
    from tidewire.cluster.node import ClusterNode

__all__ = ["CREATE_WAIT_S", "ClusterStreams", "streams_role"]

log = logging.getLogger("tidewire.cluster.streams")

#: How long a request that made ``__streams`` waits for this node's copy of the metadata to
#: name it (etcd's watch: milliseconds) before it answers a retriable NotLeaderError.
CREATE_WAIT_S = 5.0


class ClusterStreams:
    """How the stream manager of ``node``'s broker works in the cluster (see the module
    docstring); a :class:`~tidewire.broker.streams.manager.StreamsReplication`."""

    def __init__(self, node: ClusterNode) -> None:
        self._node = node
        self._creating: asyncio.Task[None] | None = None
        self._forward: AsyncStreams | None = None
        self._forward_router: Router | None = None
        self._forward_bootstrap: Transport | None = None

    # --- StreamsReplication ---------------------------------------------------------------------

    def partition_count(self) -> int | None:
        info = self._node.cache.topics.get(STREAMS_TOPIC)
        return None if info is None else info.partitions

    async def ensure_topic(self) -> None:
        """Create ``__streams`` through etcd unless it exists, and wait (up to
        :data:`CREATE_WAIT_S`) for this node's copy of the metadata to name it.

        Raises:
            RequestTimedOutError: etcd did not answer, or this node is joining or leaving.
        """
        node = self._node
        node._check_started()
        if STREAMS_TOPIC in node.cache.topics:
            return
        live = sorted(node.cache.nodes)
        if not live:
            raise RequestTimedOutError(f"node {node.node_id} sees no live node yet")
        from tidewire.cluster.node import config_to_strings  # noqa: PLC0415 (imports this)

        streams = node.broker.streams
        n = node.broker.config.stream_partitions
        rf = min(node.default_replication_factor, len(live))
        placement = assign(n, rf, live, random.randrange(len(live)))
        topic = TopicInfo(STREAMS_TOPIC, n, rf, config_to_strings(streams.log_config()))
        try:
            created = await node.store.create_topic(topic, placement, None)
        except EtcdError as exc:
            raise RequestTimedOutError(f"{STREAMS_TOPIC} not created: {exc}") from None
        if created:
            log.info("created %s: replicas %s", STREAMS_TOPIC, placement)
        with contextlib.suppress(TimeoutError):
            await node.cache.wait_for(lambda: STREAMS_TOPIC in node.cache.topics, CREATE_WAIT_S)

    def topic_soon(self) -> None:
        """Start :meth:`ensure_topic` in the background unless it runs already (a METADATA
        asked for ``__streams``: a client looks for a stream's owner)."""
        if self._creating is None or self._creating.done():
            self._creating = asyncio.get_running_loop().create_task(
                self._create_quietly(), name=f"node {self._node.node_id}: {STREAMS_TOPIC}"
            )

    async def _create_quietly(self) -> None:
        try:
            await self.ensure_topic()
        except TidewireError as exc:  # the client asks again
            log.warning("%s not created yet: %s", STREAMS_TOPIC, exc)

    def not_leader(self, partition: int) -> NotLeaderError:
        rep = self._node.broker.replication
        if rep is None:
            return NotLeaderError(f"node {self._node.node_id} does not replicate yet")
        try:
            rep.check_leader(STREAMS_TOPIC, partition)
        except NotLeaderError as exc:
            return exc
        return NotLeaderError(  # led, and not taken over yet: the next attempt finds it
            f"node {self._node.node_id} is taking over {STREAMS_TOPIC} partition {partition}; "
            "try again"
        )

    def isr_error(self, partition: int) -> TidewireError | None:
        rep = self._node.broker.replication
        if rep is None:
            return self.not_leader(partition)
        try:
            leader = rep.check_leader(STREAMS_TOPIC, partition)
        except NotLeaderError as exc:
            return exc
        if leader.can_append_acks_all():
            return None
        return NotEnoughReplicasError(
            f"{STREAMS_TOPIC}/{partition}: {len(leader.isr)} in-sync replica(s) "
            f"{sorted(leader.isr)}, min_insync_replicas is {leader.min_insync}; nothing was stored"
        )

    def high_watermark(self, partition: int) -> int:
        rep = self._node.broker.replication
        if rep is None:
            return 0
        return rep.high_watermark(STREAMS_TOPIC, partition)

    async def wait_replicated(self, partition: int, end: int) -> None:
        rep = self._node.broker.replication
        if rep is None:
            raise self.not_leader(partition)
        await rep.wait_replicated(STREAMS_TOPIC, partition, end, rep.ack_timeout_s)

    def appended(self, partition: int) -> None:
        self._node.broker._wake(STREAMS_TOPIC, partition)

    # --- forwarding -----------------------------------------------------------------------------

    def forwarder(self) -> AsyncStreams:
        """A stream client of this node that routes each request to the stream's owner (the
        HTTP gateways forward with it), made on first use. It connects as the node connects
        to its partitions' leaders (``--node-tls-*``, ``--node-api-key-file``): with
        authorization on, that principal needs the stream permissions of what it forwards
        (the gateway checked the caller's before forwarding)."""
        if self._forward is None:
            from tidewire.client._routing import Router  # noqa: PLC0415 (the server side only)
            from tidewire.client._streams import AsyncStreams  # noqa: PLC0415

            node = self._node
            connect = node.replica_connect or default_connect

            def link(address: object) -> Transport:  # the router closes what it opens
                host, _, port = str(address).rpartition(":")
                return cast("Transport", connect(host, int(port)))

            bootstrap = self._forward_bootstrap = link(f"{node.info.host}:{node.info.port}")
            self._forward_router = Router(bootstrap, link)
            self._forward = AsyncStreams(bootstrap, self._forward_router)
        return self._forward

    async def close(self) -> None:
        """This node leaves its cluster: it serves no partition any more (its requests are
        answered NotLeaderError), and the forwarding client's connections close."""
        if self._creating is not None:
            self._creating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._creating
            self._creating = None
        with contextlib.suppress(InvalidRequestError):  # the broker is not running
            streams = self._node.broker.streams
            for p in sorted(streams.led_partitions):
                streams.give_up(p)
        router, self._forward_router, self._forward = self._forward_router, None, None
        if router is not None:
            await router.close()
        bootstrap, self._forward_bootstrap = self._forward_bootstrap, None
        if bootstrap is not None:
            await bootstrap.close()


def streams_role(node: ClusterNode, partition: int, *, leading: bool) -> None:
    """The reconcile pass's word that ``node`` now leads partition ``partition`` of
    ``__streams`` (its streams are indexed and served here) or no longer does (forgotten)."""
    try:
        streams = node.broker.streams
    except InvalidRequestError:  # the broker is not running
        return
    if leading:
        streams.take_over(partition)
    else:
        streams.give_up(partition)
