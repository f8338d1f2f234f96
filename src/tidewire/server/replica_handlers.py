"""The replication API between the nodes of a cluster: REPLICA_FETCH (key 63), a follower
copying a leader's log. The gate has checked that the caller may (``cluster_action`` on the
cluster: the nodes' own identity; anyone with security off).

On a single node (``broker.replication`` None) the request is refused as a whole: there is
no partition this node leads for others.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tidewire.errors import InvalidRequestError
from tidewire.protocol.messages import ApiKey, Body, ReplicaFetchRequest, ReplicaFetchResponse

if TYPE_CHECKING:
    from tidewire.broker import Broker
    from tidewire.server.handlers import ServerInfo

__all__ = ["REPLICA_HANDLERS"]

Reply = tuple[Body | None, list[bytes]]


async def replica_fetch(b: Broker, s: ServerInfo, req: ReplicaFetchRequest, _: memoryview) -> Reply:
    if b.replication is None:
        raise InvalidRequestError("this broker is not a cluster node: it has no replicas")
    results, data = await b.replication.replica_fetch(req)
    return ReplicaFetchResponse(partitions=results), data


REPLICA_HANDLERS: dict[int, Callable[[Broker, ServerInfo, Any, memoryview], Awaitable[Reply]]] = {
    ApiKey.REPLICA_FETCH: replica_fetch,
}
