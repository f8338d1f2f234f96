"""Replication with security on: a follower connects to its leader over TLS and authenticates
as the node principal (``tidewire.cluster.fetcher.node_connect``); the leader's gate lets
REPLICA_FETCH through only for a principal allowed ``cluster_action`` on the cluster, and a
node refused says so in its log.

Two in-process nodes (as in test_replication.py, roles set by the test, no etcd), each with
authentication on and a TLS listener; every wait is bounded and nothing is timed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from tidewire.broker import Broker, BrokerConfig
from tidewire.client import AsyncClient, Credentials, Message, TlsOptions
from tidewire.cluster.fetcher import node_connect
from tidewire.cluster.replication import ReplicaManager
from tidewire.security.certs import issue, make_ca, write_key, write_pem
from tidewire.security.config import SecurityConfig, TlsConfig
from tidewire.security.model import Acl, Operation, ResourceType
from tidewire.server import ServerConfig, TcpServer

T = "orders"
NODE = "tidewire-node"  # the node principal: allowed cluster_action
WEAK = "some-service"  # a principal without it
CERT_NODE = "node-by-cert"  # a client certificate's CN: no principal, an ACL by name


async def _until(check: object, what: str, timeout_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():  # type: ignore[operator]
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def two_nodes(
    tmp_path: Path, key_of: str | None, cert_cn: str | None = None
) -> AsyncIterator[tuple[Broker, Broker, str]]:
    """Node 1 leads ``orders``/0, node 2 follows it authenticated with a key of ``key_of``
    or with a client certificate of CN ``cert_cn`` (listeners then take client
    certificates); yields both brokers and the admin key of node 1."""
    ca = make_ca()
    write_pem(tmp_path / "ca.pem", ca.cert_pem)
    server = issue(ca, "127.0.0.1", hosts=("127.0.0.1",))
    write_pem(tmp_path / "server.pem", server.cert_pem)
    write_key(tmp_path / "server.key", server.key_pem)
    mtls = {}
    if cert_cn is not None:
        node_cert = issue(ca, cert_cn, client=True)
        write_pem(tmp_path / "node.pem", node_cert.cert_pem)
        write_key(tmp_path / "node.key", node_cert.key_pem)
        mtls = {"tls_ca_file": str(tmp_path / "ca.pem"), "tls_client_auth": "optional"}
    tls = TlsConfig(
        tls_cert_file=str(tmp_path / "server.pem"),
        tls_key_file=str(tmp_path / "server.key"),
        **mtls,
    )
    security = SecurityConfig(authentication=True, scram_iterations=4096)
    brokers: list[Broker] = []
    servers: list[TcpServer] = []
    try:
        for n in (1, 2):
            b = Broker(
                BrokerConfig(data_dir=str(tmp_path / f"node{n}"), auto_create_topics=False),
                security=security,
            )
            await b.start()
            brokers.append(b)
            s = TcpServer(b, ServerConfig(host="127.0.0.1", port=0), tls=tls)
            await s.start()
            servers.append(s)
        # The same principals and the same key on both nodes (each node keeps its own
        # security data): the key made on node 1, its record written to node 2 too.
        for b in brokers:
            for name in (NODE, WEAK):
                await b.security.create_principal(name, kind="service")
            await b.security.add_acls(
                [
                    Acl(
                        principal=who,
                        resource_type=ResourceType.CLUSTER,
                        pattern="cluster",
                        operation=Operation.CLUSTER_ACTION,
                    )
                    for who in (NODE, CERT_NODE)
                ]
            )
        credentials = None
        if key_of is not None:
            rec, key = await brokers[0].security.create_key(key_of)
            await brokers[1].security._write([(f"key/{rec.id}", msgspec.json.encode(rec))])
            credentials = Credentials(key)
        admin = (tmp_path / "node1" / "bootstrap-admin.key").read_text().strip()
        connect = node_connect(
            tls=TlsOptions(
                ca_file=str(tmp_path / "ca.pem"),
                cert_file=None if cert_cn is None else str(tmp_path / "node.pem"),
                key_file=None if cert_cn is None else str(tmp_path / "node.key"),
            ),
            credentials=credentials,
        )
        reps = []
        for n, (b, s) in enumerate(zip(brokers, servers, strict=True), start=1):
            rep = ReplicaManager(
                b, n, connect=connect, advertise=("127.0.0.1", s.port), fetch_max_wait_ms=200
            )
            b.replication = rep
            b.create_topic(T, partitions=1)
            reps.append(rep)
        await reps[0].become_leader(T, 0, epoch=0, replicas=(1, 2), isr=(1,))
        await reps[1].become_follower(
            T, 0, epoch=0, leader=1, leader_address=("127.0.0.1", servers[0].port)
        )
        yield brokers[0], brokers[1], admin
    finally:
        for s in servers:
            with contextlib.suppress(Exception):
                await s.close()
        for b in brokers:
            with contextlib.suppress(Exception):
                await b.close()


async def _produce(leader: Broker, admin: str, port: int) -> None:
    async with AsyncClient(
        f"127.0.0.1:{port}",
        credentials=Credentials(admin),
        tls=TlsOptions(ca_file=str(Path(leader.config.data_dir).parent / "ca.pem")),
    ) as c:
        await asyncio.wait_for(c.produce(T, 0, [Message(b"a"), Message(b"b")]), 20)


def _port(b: Broker) -> int:
    rep = b.replication
    assert rep is not None
    return rep.advertise[1]  # type: ignore[attr-defined,no-any-return]


def test_a_node_principal_with_cluster_action_replicates_over_tls(tmp_path: Path) -> None:
    async def main() -> None:
        async with two_nodes(tmp_path, NODE) as (leader, follower, admin):
            await _produce(leader, admin, _port(leader))
            await _until(lambda: follower.log(T, 0).log_end_offset == 2, "the follower copied both")

    asyncio.run(main())


def test_a_node_client_certificate_named_in_an_acl_replicates(tmp_path: Path) -> None:
    async def main() -> None:
        async with two_nodes(tmp_path, None, cert_cn=CERT_NODE) as (leader, follower, admin):
            await _produce(leader, admin, _port(leader))
            await _until(lambda: follower.log(T, 0).log_end_offset == 2, "the follower copied both")

    asyncio.run(main())


def test_a_principal_without_cluster_action_is_refused_replica_fetch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        with caplog.at_level(logging.ERROR, logger="tidewire.cluster.fetcher"):
            async with two_nodes(tmp_path, WEAK) as (leader, follower, admin):
                await _produce(leader, admin, _port(leader))
                await _until(
                    lambda: any("cluster_action" in r.getMessage() for r in caplog.records),
                    "the refusal logged",
                )
                assert follower.log(T, 0).log_end_offset == 0

    asyncio.run(main())
    (line,) = {r.getMessage() for r in caplog.records if "cannot copy" in r.getMessage()}
    assert "node 2 cannot copy from leader node 1" in line
    assert f"{WEAK} may not cluster_action" in line
    assert "twk_" not in line


def test_a_node_without_credentials_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        with caplog.at_level(logging.ERROR, logger="tidewire.cluster.fetcher"):
            async with two_nodes(tmp_path, None) as (leader, follower, admin):
                await _produce(leader, admin, _port(leader))
                await _until(
                    lambda: any("cannot copy" in r.getMessage() for r in caplog.records),
                    "the refusal logged",
                )
                assert follower.log(T, 0).log_end_offset == 0

    asyncio.run(main())
    line = next(r.getMessage() for r in caplog.records if "cannot copy" in r.getMessage())
    assert "authentication required" in line
