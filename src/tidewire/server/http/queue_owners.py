"""The counts of queues served by other nodes of a cluster, for the HTTP API's listing and
description of queues (docs/queues.md, "Queues in a cluster").

Every node holds every durable queue's settings (``__queue_definitions``), but only its
owner (the leader of partition 0 of ``__queue.NAME``) serves it and counts its messages,
consumers and fates. ``GET /v1/queues`` and ``GET /v1/queues/{name}`` on another node ask
the owners with ``LIST_QUEUES`` (one request per owner node, all at once, each waited for
:data:`OWNER_TIMEOUT_S` at most, as this node's identity) and show their counts. An owner
that does not answer in time leaves its queues with their settings and no counts (logged);
a single node never asks anyone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import msgspec

from tidewire.broker import Broker
from tidewire.broker.queues.model import QueueCounters, QueueStatus
from tidewire.broker.queues.store import queue_topic
from tidewire.cluster import cluster_node
from tidewire.errors import TidewireError, for_code
from tidewire.protocol.messages import ListQueuesRequest, QueueInfo
from tidewire.server.http.peers import PeerClient

__all__ = ["OWNER_TIMEOUT_S", "owner_of", "with_counts", "with_owners_counts"]

log = logging.getLogger("tidewire.http")

#: How long a listing waits for a queue owner's answer (s): an owner answers LIST_QUEUES from
#: memory, so a live one answers well within it; one that does not is left without counts
#: rather than holding the listing up.
OWNER_TIMEOUT_S = 5.0


def owner_of(broker: Broker, name: str) -> int | None:
    """The node serving durable queue ``name`` when it is another node of the cluster (as
    this node's copy of the metadata names it); None on a single node, when this node is
    its owner, or when it has none now."""
    node = cluster_node(broker)
    if node is None:
        return None
    if node.queues is not None:  # a durable queue's, or a transient one's (its node)
        leader = node.queues.owner_of(name)
    else:
        got = node.cache.partition(queue_topic(name), 0)
        leader = -1 if got is None else got[0].leader
    if leader < 0 or leader == node.node_id or leader not in node.cache.nodes:
        return None
    return leader


async def with_owners_counts(broker: Broker, statuses: list[QueueStatus]) -> list[QueueStatus]:
    """``statuses`` with the counts of the durable queues other nodes serve replaced by
    their owners' (see the module docstring); the same list on a single node."""
    node = cluster_node(broker)
    if node is None:
        return statuses
    wanted: dict[int, set[str]] = {}
    for s in statuses:
        if not s.spec.exclusive and (owner := owner_of(broker, s.spec.name)) is not None:
            wanted.setdefault(owner, set()).add(s.spec.name)
    if not wanted:
        return statuses
    peer = PeerClient(node)
    try:
        asked = sorted(wanted)
        answers = await asyncio.gather(*(_list_on(peer, n) for n in asked))
    finally:
        await peer.close()
    found: dict[str, QueueInfo] = {}
    for owner, infos in zip(asked, answers, strict=True):
        found.update((i.name, i) for i in infos if i.name in wanted[owner])
    return [with_counts(s, found[s.spec.name]) if s.spec.name in found else s for s in statuses]


async def _list_on(peer: PeerClient, node_id: int) -> list[QueueInfo]:
    """The queues node ``node_id`` lists, with its counts; none when it did not answer in
    time (logged)."""
    try:
        body = await peer.ask_node(node_id, ListQueuesRequest(), timeout_s=OWNER_TIMEOUT_S)
        if body.error_code:
            raise for_code(body.error_code)(body.error_message)
    except TidewireError as exc:
        log.warning("queue counts of node %d not read (shown without counts): %s", node_id, exc)
        return []
    return list(body.queues)


def with_counts(s: QueueStatus, info: QueueInfo) -> QueueStatus:
    """``s`` with the counts ``info`` gives (another node's answer)."""
    return dataclasses.replace(
        s,
        ready=info.ready,
        unacked=info.unacked,
        delayed=info.delayed,
        bytes=info.bytes,
        consumers=info.consumers,
        counters=QueueCounters(**msgspec.structs.asdict(info.counters)),
    )
