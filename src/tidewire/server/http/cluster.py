"""The HTTP API on a node of a cluster: which node serves a request for a partition or a
group, and, with ``http_cluster_routing = "redirect"``, where to redirect it (docs/cluster.md,
"The HTTP API in a cluster"). With ``"forward"`` (the default) the routes send such a request
to that node themselves (peers.py) and never answer ``307``: the checks below then only tell
them where it goes, and a request nobody can serve now is ``503`` (:func:`no_redirect`).

- A publish goes to the leader of the partition it lands in: a node that does not lead it
  (redirect mode) answers ``307 Temporary Redirect`` to the same path and query on the
  leader's HTTP listener (which every node registers with the cluster), so a client that
  follows redirects (curl ``-L``, httpx ``follow_redirects=True``, requests by default)
  sends the same body there.
  Messages without a key or a partition go to a partition this node leads, when it leads one,
  so that they are stored where they arrived.
- A read of a partition is answered by any node that holds a replica of it (below the high
  watermark its leader last gave it, as every in-sync replica holds); a node that holds none
  redirects to the partition's leader.
- A request about a consumer group (describe, commit, reset) goes to its coordinator, the
  leader of the group's partition of ``__consumer_offsets``: another node redirects it there
  the same way.
- When the leader's HTTP address is not known (no leader now, or it has no HTTP listener) the
  answer is ``503`` with ``Retry-After``, as for any retriable error; a publish to a
  partition without a leader now is ``503`` in both modes (not ``400``: retry).

A single node (no cluster) never takes any of these paths.
"""

from __future__ import annotations

from tidewire.broker import Broker
from tidewire.client._routing import OFFSETS_TOPIC, coordinator_partition
from tidewire.cluster import cluster_node
from tidewire.errors import (
    InvalidRequestError,
    NotCoordinatorError,
    NotLeaderError,
    UnknownTopicError,
)

__all__ = [
    "leader_location",
    "led_here",
    "no_redirect",
    "partition_count",
    "require_coordinator",
    "require_leader",
    "require_replica",
    "topic_partition_count",
]


def partition_count(broker: Broker, topic: str) -> int | None:
    """In a cluster: the partition count of ``topic`` from the cluster's metadata (whether or
    not this node holds a replica of it). None on a single node.

    Raises:
        UnknownTopicError: the cluster has no such topic (a cluster does not create topics on
            first publish).
    """
    node = cluster_node(broker)
    if node is None:
        return None
    info = node.cache.topics.get(topic)
    if info is None:
        raise UnknownTopicError(
            f"topic {topic!r} does not exist (in a cluster, create it first: tidewire topic create)"
        )
    return info.partitions


def topic_partition_count(broker: Broker, topic: str) -> int:
    """The partition count of ``topic``: the cluster's (whatever replicas this node holds),
    or the broker's own on a single node.

    Raises:
        UnknownTopicError: no such topic.
    """
    n = partition_count(broker, topic)
    return broker.partition_count(topic) if n is None else n


def led_here(broker: Broker, topic: str, n: int) -> list[int]:
    """The partitions of ``topic`` (of ``n``) this node leads (every one on a single node)."""
    rep = broker.replication
    if rep is None:
        return list(range(n))
    return [p for p in range(n) if rep.leads(topic, p)]


def require_leader(broker: Broker, topic: str, partitions: set[int]) -> None:
    """Before storing anything: refuse a publish whose messages go to ``partitions`` unless
    this node leads them all, naming the leader when one other node leads them all (the
    request can then be sent there whole).

    Raises:
        NotLeaderError: this node does not lead them (with the leader's id when one other
            node leads them all; without when one of them has no leader now: retry).
        InvalidRequestError: they are led by several nodes.
    """
    rep = broker.replication
    if rep is None:
        return
    elsewhere = {p: _leader(broker, topic, p) for p in partitions if not rep.leads(topic, p)}
    if not elsewhere:
        return
    leaderless = sorted(p for p, leader in elsewhere.items() if leader < 0)
    if leaderless:  # retriable (503), whether or not the others are led elsewhere
        raise NotLeaderError(
            f"partition {leaderless[0]} of topic {topic!r} has no leader now (its replicas "
            "are down, or one is being elected); nothing was stored, try again"
        )
    leaders = set(elsewhere.values())
    if len(leaders) == 1 and len(elsewhere) == len(partitions):
        (leader,) = leaders
        node = cluster_node(broker)
        info = None if node is None else node.cache.nodes.get(leader)
        if info is None or node is None or leader == node.node_id:  # not (yet) a role here
            rep.check_leader(topic, min(elsewhere))  # raises NotLeaderError as it knows it
        else:
            raise NotLeaderError(
                f"node {leader} at {info.host}:{info.port} leads partition {min(elsewhere)} "
                f"of topic {topic!r}, not this node",
                leader_id=leader,
                leader_host=info.host,
                leader_port=info.port,
            )
    raise InvalidRequestError(
        f"the messages go to partitions {sorted(partitions)} of topic {topic!r}, led by "
        "different nodes; publish each partition's messages to "
        "its leader (give each message its partition), or publish them one by one"
    )


def _leader(broker: Broker, topic: str, partition: int) -> int:
    """The partition's leader as this node knows it: as its replica was told, or (no replica
    here) from its copy of the cluster's metadata; -1 when it has none now."""
    rep = broker.replication
    known = None if rep is None else rep.leader_of(topic, partition)
    if known is not None:
        return known[0]
    node = cluster_node(broker)
    got = None if node is None else node.cache.partition(topic, partition)
    return -1 if got is None else got[0].leader


def require_replica(broker: Broker, topic: str, partition: int) -> None:
    """Before a read: in a cluster, refuse a partition of which this node holds no replica,
    naming its leader.

    Raises:
        NotLeaderError: no replica here (with the leader's id when known).
        UnknownTopicError: the cluster has no such topic.
    """
    node = cluster_node(broker)
    if node is None or (topic, partition) in broker.logs.logs:
        return
    n = partition_count(broker, topic)
    if n is None or partition >= n:
        return  # the read answers "no such partition" itself
    got = node.cache.partition(topic, partition)
    leader = got[0].leader if got is not None else -1
    info = node.cache.nodes.get(leader)
    if info is None:
        raise NotLeaderError(
            f"node {node.node_id} holds no replica of partition {partition} of topic "
            f"{topic!r}, which has no leader now"
        )
    raise NotLeaderError(
        f"node {node.node_id} holds no replica of partition {partition} of topic {topic!r}: "
        f"node {leader} at {info.host}:{info.port} leads it",
        leader_id=leader,
        leader_host=info.host,
        leader_port=info.port,
    )


async def require_coordinator(broker: Broker, group: str) -> None:
    """Before a request about consumer group ``group``: in a cluster, refuse it unless this
    node is the group's coordinator (the leader of its partition of ``__consumer_offsets``),
    naming the coordinator, so that the HTTP API redirects the request there. The offsets
    topic is created through etcd on first use (as for a client looking for a coordinator).

    Raises:
        NotCoordinatorError: another node coordinates it (with its id when known; without,
            while it has no leader or the new offsets topic is not known here yet: 503).
        RequestTimedOutError: etcd did not answer while the offsets topic was made.
    """
    node = cluster_node(broker)
    rep = broker.replication
    if node is None or rep is None:
        return
    p = coordinator_partition(group)
    if rep.leads(OFFSETS_TOPIC, p):
        return
    if OFFSETS_TOPIC not in node.cache.topics:
        await node.ensure_offsets_topic()  # made on first use, as for the other clients
    got = node.cache.partition(OFFSETS_TOPIC, p)
    leader = -1 if got is None else got[0].leader
    info = node.cache.nodes.get(leader)
    if info is None or leader == node.node_id:  # none now, or named here and not taken up yet
        raise NotCoordinatorError(
            f"group {group!r}: its coordinator, the leader of {OFFSETS_TOPIC} partition {p}, "
            "is not ready now (retry)"
        )
    raise NotCoordinatorError(
        f"group {group!r} is coordinated by node {leader} at {info.host}:{info.port} (the "
        f"leader of {OFFSETS_TOPIC} partition {p}), not by node {node.node_id}",
        leader_id=leader,
        leader_host=info.host,
        leader_port=info.port,
    )


def leader_location(broker: Broker, exc: NotLeaderError, scheme: str, target: str) -> str | None:
    """The URL to redirect a request for ``target`` (its path and query) to: the same on the
    HTTP listener of the leader ``exc`` names; None when it is not known."""
    node = cluster_node(broker)
    if node is None or exc.leader_id < 0:
        return None
    info = node.cache.nodes.get(exc.leader_id)
    if info is None or info.http_port < 0 or info.node_id == node.node_id:
        return None
    return f"{scheme}://{info.url_host}:{info.http_port}{target}"


def no_redirect(exc: NotLeaderError) -> NotLeaderError:
    """``exc`` without the leader it names, so the HTTP API answers it ``503`` with
    ``Retry-After`` (retry), not ``307``: how a node forwarding requests
    (``http_cluster_routing = "forward"``) answers a publish it could neither store nor
    forward (a partition without a leader now, or whose lead moved to another node while
    this one stored: nothing stored, a retry is forwarded to the new leader). A client set
    up for forwarding does not expect a redirect."""
    if exc.leader_id < 0:
        return exc
    return type(exc)(exc.message)
