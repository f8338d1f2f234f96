"""The stream operations of the HTTP gateways (``/v1/streams`` and the iPubSub mode), answered
from any node of a cluster.

On a single node each function is the stream manager's own call. On a node of a cluster a
stream is served by its owner, the leader of its partition of ``__streams``
(:mod:`tidewire.cluster.streams`): what this node owns is served here, the rest is
**forwarded** to its owner through the node's routed stream client
(:meth:`~tidewire.cluster.streams.ClusterStreams.forwarder`), and the answer is the owner's.
Forwarding rather than a redirect: iPubSub's own nodes forward a request to the stream's
owning node, and its clients (plain HTTP clients, many of which do not follow a ``307`` of a
``POST``) expect any node to answer; the native routes do the same, so that one address
serves every stream. A forwarded receive that its HTTP client abandons while it waits is
cancelled on this node only: a message the owner handed it meanwhile is taken and answered
to nobody (receiving stays at most once).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tidewire.broker import Broker
from tidewire.broker.streams.model import SendItem, SendResult, StreamInfo, StreamMessage
from tidewire.cluster import cluster_node
from tidewire.errors import NotEnoughReplicasError, NotLeaderError

__all__ = ["describe", "read", "receive", "send"]

#: Refusals of a stream this node does not own (nothing stored): sent on to the owner.
_ELSEWHERE = (NotLeaderError.code, NotEnoughReplicasError.code)


async def send(
    broker: Broker,
    items: Sequence[SendItem],
    *,
    ring_size: int | None = None,
    block_ms: int = 0,
) -> list[SendResult]:
    """:meth:`StreamManager.send`; in a cluster the items of streams owned elsewhere are
    sent on to their owners (each item's result is its owner's)."""
    node = cluster_node(broker)
    if node is None:
        return await broker.streams.send(items, ring_size=ring_size, block_ms=block_ms)
    try:
        results = await broker.streams.send(items, ring_size=ring_size, block_ms=block_ms)
    except NotLeaderError:  # __streams is being made: every item goes through the router
        results = [SendResult(NotLeaderError.code, "", "")] * len(items)
    again = [k for k, r in enumerate(results) if r.code in _ELSEWHERE]
    if not again:
        return results
    results = list(results)
    forwarded = await node.stream_owners.forwarder().send_many(
        [items[k] for k in again], ring_size=ring_size, block_ms=block_ms
    )
    for k, r in zip(again, forwarded, strict=True):
        results[k] = r
    return results


async def receive(
    broker: Broker,
    streams: Sequence[str],
    *,
    max_messages: int = 1,
    wait_ms: int = 0,
    ring_size: int | None = None,
) -> list[StreamMessage]:
    """:meth:`StreamManager.receive`; in a cluster at the streams' owners."""
    node = cluster_node(broker)
    manager = broker.streams
    if node is None:
        return await manager.receive(
            streams, max_messages=max_messages, wait_ms=wait_ms, ring_size=ring_size
        )
    if all(manager.serves(s) for s in streams):
        try:
            return await manager.receive(
                streams, max_messages=max_messages, wait_ms=wait_ms, ring_size=ring_size
            )
        except NotLeaderError:  # a stream moved meanwhile (nothing taken)
            pass
    return await node.stream_owners.forwarder().receive_many(
        list(streams), max_messages=max_messages, wait_ms=wait_ms, ring_size=ring_size
    )


async def read(
    broker: Broker, positions: Mapping[str, str], *, max_messages: int = 100, wait_ms: int = 0
) -> tuple[list[StreamMessage], dict[str, str]]:
    """:meth:`StreamManager.read`; in a cluster at the streams' owners."""
    node = cluster_node(broker)
    manager = broker.streams
    if node is None:
        return await manager.read(positions, max_messages=max_messages, wait_ms=wait_ms)
    if all(manager.serves(s) for s in positions):
        try:
            return await manager.read(positions, max_messages=max_messages, wait_ms=wait_ms)
        except NotLeaderError:
            pass
    return await node.stream_owners.forwarder().read(
        positions, max_messages=max_messages, wait_ms=wait_ms
    )


async def describe(broker: Broker, stream: str) -> StreamInfo | None:
    """:meth:`StreamManager.describe`; in a cluster, its owner's answer."""
    node = cluster_node(broker)
    manager = broker.streams
    if node is None or manager.serves(stream):
        try:
            return manager.describe(stream)
        except NotLeaderError:
            if node is None:
                raise
    assert node is not None
    return await node.stream_owners.forwarder().describe(stream)
