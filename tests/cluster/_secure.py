"""A cluster of in-process nodes with authentication and authorization on, for the tests of
what a cluster does as its nodes' own identity (docs/cluster.md, "Security").

Each node is a broker with ``authentication=True``, its TCP server, an HTTP gateway with the
native, msgbus and iPubSub listeners (gated as ``tidewire serve`` gates them) and a
:class:`ClusterNode` whose links to other nodes (replica fetchers, the HTTP forwarding
clients) authenticate with the node principal's key (``--node-api-key-file``:
:func:`~tidewire.cluster.fetcher.node_connect`). It is set up as docs/cluster.md says an
operator does: node 1's data directory is first served alone, where the node principal, its
key and its ``cluster_action`` grant are made; then every node starts in the cluster with
that key; the first change on node 1 (the grant again) makes node 1's security state the
cluster's, which the others copy. Every wait is bounded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx

from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import WAIT_S, InProcessNode, until
from tidewire.broker import Broker, BrokerConfig
from tidewire.client import AsyncClient, Credentials
from tidewire.cluster.fetcher import node_connect
from tidewire.cluster.node import ClusterNode
from tidewire.protocol.messages import AclEntry
from tidewire.security._logs import SECURITY_TOPIC
from tidewire.security.config import SecurityConfig
from tidewire.security.model import Acl, Operation, ResourceType
from tidewire.server import TcpServer
from tidewire.server.http import HttpConfig
from tidewire.server.http.gateway import IPUBSUB, MSGBUS, HttpGateway
from tidewire.server.tcp import ServerConfig

#: The nodes' own principal, as docs/cluster.md names it.
NODE_PRINCIPAL = "tidewire-node"

#: Every node's security settings: authentication on; SCRAM at its cheapest allowed cost;
#: every node and test client comes from 127.0.0.1, so the limit on failed
#: authentications per source address is raised and a refusal is not held back.
SECURITY = SecurityConfig(
    authentication=True,
    scram_iterations=4096,
    auth_failures_per_minute=10_000,
    auth_failure_delay_ms=0,
)


def bootstrap_key(data_dir: str) -> str:
    """The bootstrap admin's key that a broker with authentication on wrote at first start."""
    return (Path(data_dir) / "bootstrap-admin.key").read_text().strip()


async def prepare_node_principal(data_dir: str) -> str:
    """Serve ``data_dir`` as a single node once and make the node principal there: a service
    principal, its key and the ``cluster_action`` grant (docs/cluster.md, "The nodes'
    identity, before the cluster forms"). Returns the key."""
    async with Broker(
        BrokerConfig(data_dir=data_dir, auto_create_topics=False), security=SECURITY
    ) as broker:
        await broker.security.create_principal(NODE_PRINCIPAL, kind="service")
        _, key = await broker.security.create_key(NODE_PRINCIPAL)
        await broker.security.add_acls(
            [
                Acl(
                    principal=NODE_PRINCIPAL,
                    resource_type=ResourceType.CLUSTER,
                    pattern="cluster",
                    operation=Operation.CLUSTER_ACTION,
                )
            ]
        )
    return key


class SecureNode(InProcessNode):
    """One node with authentication on, an HTTP gateway, and the node key for its links to
    the other nodes (see the module docstring).

    Args:
        node_key: the node principal's API key (the same on every node).
    """

    def __init__(
        self, tmp: Path, etcd: EtcdServer, node_id: int, *, cluster_id: str, node_key: str
    ) -> None:
        super().__init__(tmp, etcd, node_id, cluster_id=cluster_id)
        self.node_key = node_key
        self.gateway: HttpGateway | None = None

    async def start(self) -> None:
        self.stopped = False  # from here on stop() closes whatever was started
        self.node = None
        self.gateway = None
        self.broker = Broker(
            BrokerConfig(data_dir=self.data, auto_create_topics=False), security=SECURITY
        )
        self.server = TcpServer(self.broker, ServerConfig(host="127.0.0.1", port=0))
        await self.broker.start()
        await self.server.start()
        self.gateway = HttpGateway.for_broker(
            self.broker,
            HttpConfig(http_port=0, http_msgbus_port=0, http_ipubsub_port=0),
        )
        await self.gateway.start()
        self.node = ClusterNode(
            self.broker,
            self.id,
            [self.etcd.endpoint],
            advertise=("127.0.0.1", self.server.port),
            http_port=self.gateway.port,
            cluster_id=self.cluster_id,
            session_timeout_s=self.session_s,
            default_replication_factor=3,
            min_insync_replicas=2,
            replica_connect=node_connect(credentials=Credentials(self.node_key)),
        )
        await self.node.start()

    async def stop(self) -> None:
        if self.stopped:
            return
        if self.gateway is not None:
            await self.gateway.close()
            self.gateway = None
        await super().stop()

    def url(self, listener: str = "") -> str:
        """The base URL of this node's native HTTP API (or of ``listener``: MSGBUS,
        IPUBSUB)."""
        assert self.gateway is not None
        port = self.gateway.port_of(listener) if listener else self.gateway.port
        return f"http://127.0.0.1:{port}"

    def http(self, key: str | None, listener: str = "") -> httpx.AsyncClient:
        """An HTTP client of this node's API (or ``listener``) sending ``key`` as its bearer
        token (None: no credentials)."""
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        return httpx.AsyncClient(base_url=self.url(listener), headers=headers, timeout=WAIT_S)

    def client(self, key: str, *others: SecureNode) -> AsyncClient:
        """A routed client authenticated with ``key``, bootstrapped on this node (and
        ``others``)."""
        addrs = [self.addr, *(n.addr for n in others)]
        return AsyncClient(addrs, credentials=Credentials(key), request_timeout_s=WAIT_S)


class SecureCluster:
    """The nodes, started and formed (see :func:`secure_cluster`); ``admin`` is node 1's
    bootstrap key, the cluster's admin."""

    def __init__(self, nodes: list[SecureNode], admin: str, node_key: str) -> None:
        self.nodes = nodes
        self.admin = admin
        self.node_key = node_key

    def by_id(self, node_id: int) -> SecureNode:
        return next(n for n in self.nodes if n.id == node_id)

    async def grant(self, *entries: AclEntry) -> None:
        """Add ``entries`` on the leader of ``__security`` (as its admin) and wait until
        every live node applies them."""
        async with self.nodes[0].client(self.admin) as c:
            await c.add_acls(list(entries))
        await self.settled()

    async def revoke(self, *entries: AclEntry) -> None:
        """Remove ``entries`` likewise."""
        async with self.nodes[0].client(self.admin) as c:
            await c.remove_acls(list(entries))
        await self.settled()

    async def settled(self) -> None:
        """Until every live node's copy of ``__security`` holds what the leader's does."""
        key = (SECURITY_TOPIC, 0)

        def ends() -> set[int]:
            return {
                n.broker.logs.get_log(*key).log_end_offset
                for n in self.nodes
                if not n.stopped and key in n.broker.logs.logs
            }

        await until(
            lambda: (
                len(ends()) == 1
                and all(key in n.broker.logs.logs for n in self.nodes if not n.stopped)
            ),
            "every node holds the same security state",
        )


def acl(principal: str, resource_type: str, pattern: str, *operations: str) -> list[AclEntry]:
    """Allow entries for ``principal`` on ``resource_type`` ``pattern``, one per operation."""
    return [
        AclEntry(principal=principal, resource_type=resource_type, pattern=pattern, operation=op)
        for op in operations
    ]


@asynccontextmanager
async def secure_cluster(
    tmp: Path, etcd: EtcdServer, cluster_id: str, n: int = 3
) -> AsyncIterator[SecureCluster]:
    """``n`` secured nodes formed into a cluster whose security state is node 1's (see the
    module docstring); stopped on the way out, whatever happened."""
    node_key = await prepare_node_principal(str(tmp / "node1"))
    admin = bootstrap_key(str(tmp / "node1"))
    nodes = [
        SecureNode(tmp, etcd, i, cluster_id=cluster_id, node_key=node_key) for i in range(1, n + 1)
    ]
    async with AsyncExitStack() as stack:
        for node in nodes:
            stack.push_async_callback(node.stop)
            await node.start()
        for node in nodes:
            await node.cluster.cache.wait_for(
                lambda c=node.cluster.cache: len(c.nodes) == n, WAIT_S
            )
        cluster = SecureCluster(nodes, admin, node_key)
        # The first change, on node 1: its state becomes the cluster's; the others copy it
        # as the node principal.
        await cluster.grant(
            *acl(NODE_PRINCIPAL, "cluster", "cluster", "cluster_action"),
        )
        yield cluster


__all__ = [
    "IPUBSUB",
    "MSGBUS",
    "NODE_PRINCIPAL",
    "SECURITY",
    "SecureCluster",
    "SecureNode",
    "acl",
    "bootstrap_key",
    "prepare_node_principal",
    "secure_cluster",
]
