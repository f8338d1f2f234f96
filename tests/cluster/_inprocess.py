"""In-process cluster nodes for the tests that need the nodes' insides: each a broker, its TCP
server and a :class:`ClusterNode` with its real replica manager, all in the test's event loop,
against the real etcd of the ``etcd`` fixture. Every wait is bounded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from tests.cluster._etcd import EtcdServer
from tidewire.broker import Broker, BrokerConfig
from tidewire.cluster.node import ClusterNode
from tidewire.security.config import TlsConfig
from tidewire.server import TcpServer
from tidewire.server.tcp import ServerConfig

WAIT_S = 30.0


class InProcessNode:
    """One node. :meth:`stop` leaves the cluster as a killed process would be seen to (its
    lease goes); :meth:`start` (again) comes back on the same data directory.

    A subclass changes the node through :meth:`make_broker`, :meth:`server_tls` and
    :meth:`before_cluster` rather than writing its own :meth:`start`.

    Args:
        cluster_id: the cluster's name in etcd (one per test module keeps them apart).
        session_s: the node's session timeout.
    """

    def __init__(
        self,
        tmp: Path,
        etcd: EtcdServer,
        node_id: int,
        *,
        cluster_id: str,
        session_s: int = 3,
    ) -> None:
        self.id = node_id
        self.data = str(tmp / f"node{node_id}")
        self.etcd = etcd
        self.cluster_id = cluster_id
        self.session_s = session_s
        self.stopped = True
        self.broker: Broker
        self.server: TcpServer
        self.node: ClusterNode | None = None

    def make_broker(self) -> Broker:
        """The node's broker (not started yet) on its data directory."""
        return Broker(BrokerConfig(data_dir=self.data, auto_create_topics=False))

    def server_tls(self) -> TlsConfig | None:
        """The TLS of the node's binary listener (None: plaintext)."""
        return None

    async def before_cluster(self) -> dict[str, Any]:
        """Start what the node has besides its broker and TCP server (both started), before
        it joins the cluster; returns more keyword arguments for its :class:`ClusterNode`."""
        return {}

    async def start(self) -> None:
        self.stopped = False  # from here on stop() closes whatever was started
        self.node = None
        self.broker = self.make_broker()
        self.server = TcpServer(
            self.broker, ServerConfig(host="127.0.0.1", port=0), tls=self.server_tls()
        )
        await self.broker.start()
        await self.server.start()
        extra = await self.before_cluster()
        self.node = ClusterNode(
            self.broker,
            self.id,
            [self.etcd.endpoint],
            advertise=("127.0.0.1", self.server.port),
            cluster_id=self.cluster_id,
            session_timeout_s=self.session_s,
            default_replication_factor=3,
            min_insync_replicas=2,
            **extra,
        )
        await self.node.start()

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        await self.server.close()
        if self.node is not None:
            await self.node.close()
        await self.broker.close()

    @property
    def cluster(self) -> ClusterNode:
        assert self.node is not None
        return self.node

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"


N = TypeVar("N", bound=InProcessNode)


@asynccontextmanager
async def in_process_cluster(make: Callable[[int], N], n: int = 3) -> AsyncIterator[list[N]]:
    """Nodes ``make(1)`` .. ``make(n)``, started, each seeing all ``n`` registered; stopped
    on the way out, whatever happened."""
    nodes = [make(i) for i in range(1, n + 1)]
    async with AsyncExitStack() as stack:
        for node in nodes:
            stack.push_async_callback(node.stop)
            await node.start()
        for node in nodes:
            await node.cluster.cache.wait_for(
                lambda c=node.cluster.cache: len(c.nodes) == n, WAIT_S
            )
        yield nodes


async def until(check: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Wait until ``check()`` holds, polling every 50 ms; fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        await asyncio.sleep(0.05)


async def stop_for_next_leader(nodes: list[N], leader: N, topic: str, partition: int = 0) -> N:
    """Stop ``leader`` of ``topic``/``partition``: the one other node that leads it next."""
    await leader.stop()
    rest = [n for n in nodes if n is not leader]

    def leads(n: N) -> bool:
        replication = n.broker.replication
        return replication is not None and replication.leads(topic, partition)

    await until(lambda: any(leads(n) for n in rest), "a new leader")
    (new,) = [n for n in rest if leads(n)]
    return new
