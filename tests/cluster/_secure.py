"""A cluster of in-process nodes with authentication and authorization on, for the tests of
what a cluster does as its nodes' own identity (docs/cluster.md, "Security").

Each node is a broker with ``authentication=True``, its TCP server, an HTTP gateway with the
native, msgbus and iPubSub listeners (gated as ``tidewire serve`` gates them) and a
:class:`ClusterNode` whose links to other nodes (replica fetchers, the HTTP forwarding
clients) authenticate as the node principal (:func:`~tidewire.cluster.fetcher.node_connect`),
in one of two ways, each set up as docs/cluster.md says an operator does:

- **a key** (``--node-api-key-file``): node 1's data directory is first served alone, where
  the node principal, its key and its ``cluster_action`` grant are made; then every node
  starts in the cluster with that key; the first change on node 1 (the grant again) makes
  node 1's security state the cluster's, which the others copy;
- **a client certificate** (``--node-tls-cert-file``, CN ``tidewire-node``) on TLS
  listeners that take client certificates: nothing is prepared; the first change on node 1
  registers the certificate's subject as a principal with the role ``node``.

Every wait is bounded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.cluster._etcd import EtcdServer
from tests.cluster._inprocess import WAIT_S, InProcessNode, until
from tidewire.broker import Broker, BrokerConfig
from tidewire.client import AsyncClient, Credentials, TlsOptions
from tidewire.cluster.fetcher import node_connect
from tidewire.protocol.messages import AclEntry
from tidewire.security._logs import SECURITY_TOPIC
from tidewire.security.certs import issue, make_ca, write_key, write_pem
from tidewire.security.config import SecurityConfig, TlsConfig
from tidewire.security.model import Acl, Operation, ResourceType
from tidewire.server.http import HttpConfig
from tidewire.server.http.gateway import IPUBSUB, MSGBUS, HttpGateway

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
        node_key: the node principal's API key (the same on every node); None: the node
            presents ``pki``'s client certificate instead.
        pki: the directory of :func:`make_pki`: the binary listener uses TLS with client
            certificates optional (None: plaintext).
    """

    def __init__(
        self,
        tmp: Path,
        etcd: EtcdServer,
        node_id: int,
        *,
        cluster_id: str,
        node_key: str | None,
        pki: Path | None = None,
    ) -> None:
        super().__init__(tmp, etcd, node_id, cluster_id=cluster_id)
        self.node_key = node_key
        self.pki = pki
        self.gateway: HttpGateway | None = None

    def make_broker(self) -> Broker:
        return Broker(BrokerConfig(data_dir=self.data, auto_create_topics=False), security=SECURITY)

    def server_tls(self) -> TlsConfig | None:
        if self.pki is None:
            return None
        return TlsConfig(
            tls_cert_file=str(self.pki / "server.pem"),
            tls_key_file=str(self.pki / "server.key"),
            tls_ca_file=str(self.pki / "ca.pem"),
            tls_client_auth="optional",
        )

    async def start(self) -> None:
        self.gateway = None
        await super().start()

    async def before_cluster(self) -> dict[str, Any]:
        self.gateway = HttpGateway.for_broker(
            self.broker,
            HttpConfig(http_port=0, http_msgbus_port=0, http_ipubsub_port=0),
        )
        await self.gateway.start()
        return {
            "http_port": self.gateway.port,
            "replica_connect": node_connect(
                tls=self.tls(client_cert=self.node_key is None),
                credentials=None if self.node_key is None else Credentials(self.node_key),
            ),
        }

    async def stop(self) -> None:
        if self.stopped:
            return
        if self.gateway is not None:
            await self.gateway.close()
            self.gateway = None
        await super().stop()

    def tls(self, *, client_cert: bool = False) -> TlsOptions | None:
        """TLS to this cluster's binary listeners (None: plaintext), presenting the node's
        client certificate when ``client_cert``."""
        if self.pki is None:
            return None
        return TlsOptions(
            ca_file=str(self.pki / "ca.pem"),
            cert_file=str(self.pki / "node.pem") if client_cert else None,
            key_file=str(self.pki / "node.key") if client_cert else None,
        )

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
        return AsyncClient(
            addrs, credentials=Credentials(key), tls=self.tls(), request_timeout_s=WAIT_S
        )


class SecureCluster:
    """The nodes, started and formed (see :func:`secure_cluster`); ``admin`` is node 1's
    bootstrap key, the cluster's admin."""

    def __init__(self, nodes: list[SecureNode], admin: str, node_key: str | None) -> None:
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


def make_pki(directory: Path) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate of CN
    :data:`NODE_PRINCIPAL` in ``directory`` (``ca.pem``, ``server.pem``/``.key``,
    ``node.pem``/``.key``); returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca()
    write_pem(directory / "ca.pem", ca.cert_pem)
    for name, cert in (
        ("server", issue(ca, "127.0.0.1", hosts=("127.0.0.1",))),
        ("node", issue(ca, NODE_PRINCIPAL, client=True)),
    ):
        write_pem(directory / f"{name}.pem", cert.cert_pem)
        write_key(directory / f"{name}.key", cert.key_pem)
    return directory


@asynccontextmanager
async def secure_cluster(
    tmp: Path, etcd: EtcdServer, cluster_id: str, n: int = 3, *, identity: str = "key"
) -> AsyncIterator[SecureCluster]:
    """``n`` secured nodes formed into a cluster whose security state is node 1's (see the
    module docstring), the nodes identified by ``identity``: ``key`` or ``certificate``;
    stopped on the way out, whatever happened."""
    node_key: str | None = None
    pki: Path | None = None
    if identity == "key":
        node_key = await prepare_node_principal(str(tmp / "node1"))
    else:
        assert identity == "certificate", identity
        pki = make_pki(tmp / "pki")
    nodes = [
        SecureNode(tmp, etcd, i, cluster_id=cluster_id, node_key=node_key, pki=pki)
        for i in range(1, n + 1)
    ]
    async with AsyncExitStack() as stack:
        for node in nodes:
            stack.push_async_callback(node.stop)
            await node.start()
        admin = bootstrap_key(str(tmp / "node1"))
        for node in nodes:
            await node.cluster.cache.wait_for(
                lambda c=node.cluster.cache: len(c.nodes) == n, WAIT_S
            )
        cluster = SecureCluster(nodes, admin, node_key)
        # The first change, on node 1: its state becomes the cluster's; the others copy it
        # as the node principal.
        if node_key is not None:
            await cluster.grant(*acl(NODE_PRINCIPAL, "cluster", "cluster", "cluster_action"))
        else:
            async with nodes[0].client(admin) as c:
                await c.create_principal(NODE_PRINCIPAL, kind="service", roles=["node"])
            await cluster.settled()
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
    "make_pki",
    "prepare_node_principal",
    "secure_cluster",
]
