"""ALTER_REPLICATION (key 64): a cluster topic's replication changed through etcd — its
partitions moved to other replica sets or another replication factor, moves under way
cancelled, its ``min_insync_replicas`` or ``unclean_leader_election``
(:mod:`tidewire.cluster.reassign`); with nothing to change, the status of its moves. A
single node refuses it. The HTTP routes ``/v1/cluster/reassignments`` do the same."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tidewire.cluster import cluster_node, reassign
from tidewire.errors import (
    InvalidConfigError,
    InvalidRequestError,
    TidewireError,
    UnknownTopicError,
)
from tidewire.protocol.messages import (
    AlterReplicationRequest,
    AlterReplicationResponse,
    ApiKey,
    Body,
    PartitionReplication,
    TopicConfig,
)
from tidewire.storage import LogConfig

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.cluster.node import ClusterNode
    from tidewire.server.handlers import ServerInfo

__all__ = ["CLUSTER_ADMIN_HANDLERS", "cluster_alter_topic", "create_topic", "wire_moves"]

Reply = tuple[Body | None, list[bytes]]


async def create_topic(
    broker: Broker,
    name: str,
    partitions: int | None,
    config: LogConfig,
    replication_factor: int | None = None,
    *,
    min_insync_replicas: int | None = None,
    unclean_leader_election: bool | None = None,
) -> None:
    """Create a topic where it belongs, for every interface (CREATE_TOPIC, ``POST
    /v1/topics``): in a cluster through etcd, its replicas over the live nodes; on a single
    node in its own logs, where the cluster's settings above one copy are refused.

    Raises:
        InvalidConfigError: a cluster's setting on a single node; what
            :meth:`ClusterNode.create_topic` or :meth:`Broker.create_topic_async` raise.
    """
    node = cluster_node(broker)
    if node is not None:
        await node.create_topic(
            name,
            partitions,
            config,
            replication_factor,
            min_insync_replicas=min_insync_replicas,
            unclean_leader_election=unclean_leader_election,
        )
        return
    if (
        replication_factor not in (None, 1)
        or min_insync_replicas not in (None, 1)
        or unclean_leader_election
    ):
        raise InvalidConfigError(
            "a replication factor or min_insync_replicas above 1 and unclean_leader_election "
            "are settings of a cluster's topics (docs/cluster.md); a single node holds one copy"
        )
    await broker.create_topic_async(name, partitions, config)


def wire_moves(moves: list[reassign.PartitionMove]) -> list[PartitionReplication]:
    return [
        PartitionReplication(
            partition=m.partition,
            replicas=list(m.replicas),
            isr=list(m.isr),
            leader=m.leader,
            leader_epoch=m.leader_epoch,
            target=list(m.target),
            original=list(m.original),
        )
        for m in moves
    ]


def _changes(req: AlterReplicationRequest) -> str:
    parts = []
    if req.assignments:
        parts.append(
            "replicas "
            + "; ".join(f"{a.partition}:{','.join(map(str, a.replicas))}" for a in req.assignments)
        )
    if req.replication_factor is not None:
        parts.append(f"replication_factor={req.replication_factor}")
    if req.min_insync_replicas is not None:
        parts.append(f"min_insync_replicas={req.min_insync_replicas}")
    if req.unclean_leader_election is not None:
        parts.append(f"unclean_leader_election={req.unclean_leader_election}")
    if req.cancel:
        parts.append(f"cancel {','.join(map(str, req.partitions)) or 'every move'}")
    return ", ".join(parts)


async def alter_replication(
    b: Broker, s: ServerInfo, req: AlterReplicationRequest, _: memoryview
) -> Reply:
    changes = _changes(req)
    try:
        node = cluster_node(b)
        if node is None:
            raise InvalidRequestError(
                "this broker is not a cluster node: a topic's replication is a cluster's"
            )
        if req.min_insync_replicas is not None or req.unclean_leader_election is not None:
            await reassign.alter_topic(
                node,
                req.topic,
                min_insync_replicas=req.min_insync_replicas,
                unclean_leader_election=req.unclean_leader_election,
            )
        if req.cancel and (req.assignments or req.replication_factor is not None):
            raise InvalidRequestError("cancel moves, or start them: not both at once")
        if req.cancel:
            moves = await reassign.cancel(node, req.topic, req.partitions)
        elif req.assignments or req.replication_factor is not None:
            targets = (
                {a.partition: a.replicas for a in req.assignments} if req.assignments else None
            )
            if targets is not None and len(targets) != len(req.assignments):
                raise InvalidRequestError("a partition is named twice")
            moves = await reassign.reassign(
                node, req.topic, targets, replication_factor=req.replication_factor
            )
        else:
            moves = reassign.status(node, req.topic)
    except TidewireError as exc:
        if changes and b.audit is not None:
            b.audit.event(
                "ALTER_REPLICATION",
                "failed",
                resource=f"topic:{req.topic}",
                reason=exc.message,
                detail={"changes": changes},
            )
        return AlterReplicationResponse(error_code=exc.code, error_message=exc.message), []
    if changes and b.audit is not None:
        b.audit.event(
            "ALTER_REPLICATION", "ok", resource=f"topic:{req.topic}", detail={"changes": changes}
        )
    return AlterReplicationResponse(partitions=wire_moves(moves)), []


CLUSTER_ADMIN_HANDLERS: dict[
    int, Callable[[Broker, ServerInfo, Any, memoryview], Awaitable[Reply]]
] = {
    ApiKey.ALTER_REPLICATION: alter_replication,
}


async def cluster_alter_topic(
    node: ClusterNode,
    name: str,
    partitions: int | None,
    config: TopicConfig,
    to_log_config: Callable[[LogConfig, TopicConfig], LogConfig],
) -> None:
    """ALTER_TOPIC in a cluster: the change made in etcd (more partitions, other settings
    over the topic's current ones: ``to_log_config(current, config)``), applied by every
    replica.

    Raises:
        What :func:`tidewire.cluster.reassign.alter_topic` raises; InvalidConfigError.
    """
    from tidewire.cluster.node import config_of  # noqa: PLC0415 (only for a cluster)

    info = node.cache.topics.get(name)
    if info is None:
        raise UnknownTopicError(f"topic {name!r} does not exist")
    new_cfg = None
    if config != TopicConfig():
        new_cfg = to_log_config(config_of(info, node.broker.config.log), config)
    await reassign.alter_topic(node, name, partitions=partitions, config=new_cfg)
