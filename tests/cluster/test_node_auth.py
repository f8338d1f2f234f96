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
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from tests.cli._support import popen_serve, run_cli, stop
from tests.cluster._etcd import EtcdServer
from tests.cluster.test_node_process import until as node_until
from tidewire.broker import Broker, BrokerConfig
from tidewire.client import AsyncClient, Credentials, Message, TlsOptions
from tidewire.cluster.fetcher import node_connect
from tidewire.cluster.replication import ReplicaManager
from tidewire.protocol.messages import ACKS_DURABLE, CreateTopicRequest, MetadataRequest
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


# --- real processes ------------------------------------------------------------------------------


def _start_secured(data_dir: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    """``tidewire serve`` with authentication on: its first line names the bootstrap key
    file, a later one the port."""
    proc = popen_serve("--data-dir", str(data_dir), "--port", "0", *args)
    assert proc.stdout is not None
    for _ in range(5):  # bounded: the listening line comes among the first few
        line = proc.stdout.readline()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m is not None:
            return proc, int(m.group(1))
        if not line:
            break
    stop(proc)
    pytest.fail(f"serve did not start: {line!r}")


def test_serve_cluster_with_authentication_and_mtls_replicates(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """Two ``tidewire serve --cluster`` processes with authentication and TLS on, each node
    presenting ``--node-tls-cert-file`` (CN tidewire-node) to its leader: once node 1 allows
    that principal ``cluster_action`` (the grant is replicated to node 2 with the rest of
    node 1's security state), an acks=all produce with min_insync 2 (which needs the
    follower's copy) is answered."""
    ca = make_ca()
    pki = tmp_path / "pki"
    pki.mkdir()
    write_pem(pki / "ca.pem", ca.cert_pem)
    for name, cert in (
        ("server", issue(ca, "127.0.0.1", hosts=("127.0.0.1",))),
        ("node", issue(ca, "tidewire-node", client=True)),
    ):
        write_pem(pki / f"{name}.pem", cert.cert_pem)
        write_key(pki / f"{name}.key", cert.key_pem)
    cluster = f"etcd://127.0.0.1:{etcd.client_port}"
    ca_file = str(pki / "ca.pem")
    procs = {}
    try:
        for n in (1, 2):
            procs[n] = _start_secured(
                tmp_path / f"node{n}",
                *("--node-id", str(n), "--cluster", cluster, "--session-timeout", "2"),
                *("--min-insync-replicas", "2", "--authentication"),
                *("--tls-cert-file", str(pki / "server.pem")),
                *("--tls-key-file", str(pki / "server.key")),
                *("--tls-ca-file", ca_file, "--tls-client-auth", "optional"),
                *("--node-tls-cert-file", str(pki / "node.pem")),
                *("--node-tls-key-file", str(pki / "node.key")),
            )
        addr = {n: f"127.0.0.1:{port}" for n, (_, port) in procs.items()}
        admin = {
            n: (tmp_path / f"node{n}" / "bootstrap-admin.key").read_text().strip() for n in (1, 2)
        }
        # The first security change makes node 1's state the cluster's (__security,
        # replicated): node 2 copies it, node 1's admin then holds on both.
        out = run_cli(
            [
                *("acl", "add", "--addr", addr[1], "--tls-ca", ca_file),
                *("--api-key", admin[1], "--cluster", "--principal", "tidewire-node"),
                *("--operation", "cluster_action"),
            ]
        )
        assert out.exit_code == 0, out.output

        def client(n: int) -> AsyncClient:
            return AsyncClient(
                addr[n],
                credentials=Credentials(admin[1]),
                tls=TlsOptions(ca_file=ca_file),
                request_timeout_s=30,
            )

        async def main() -> None:
            async def both_registered() -> bool | None:
                async with client(1) as c:
                    meta = await c._t.request(MetadataRequest())
                return True if len(meta.body.nodes) == 2 else None

            await node_until("2 nodes registered", both_registered, 30)
            async with client(1) as c:
                reply = await c._t.request(
                    CreateTopicRequest(name=T, partitions=1, replication_factor=2)
                )
                assert reply.body.error_code == 0, reply.body

            async def leader() -> int | None:
                async with client(1) as c:
                    meta = (await c._t.request(MetadataRequest(topics=[T]))).body
                if not meta.topics or not meta.topics[0].partitions:
                    return None
                (p,) = meta.topics[0].partitions
                return p.leader if p.leader >= 0 and len(p.isr) == 2 else None

            lead = await node_until("topic placed, both in sync", leader, 30)

            async def produced() -> int | None:
                async with client(lead) as c:
                    return await c.produce(T, 0, [Message(b"x")], acks=ACKS_DURABLE)

            assert await node_until("acks=all answered", produced, 30) == 0
            # Answered with the follower in the ISR (a follower refused by the leader would
            # have been dropped from it first, after --replica-lag-max-ms).
            async with client(lead) as c:
                meta = (await c._t.request(MetadataRequest(topics=[T]))).body
            (p,) = meta.topics[0].partitions
            assert sorted(p.isr) == [1, 2]

        asyncio.run(main())
    finally:
        for proc, _ in procs.values():
            stop(proc)


def test_serve_refuses_bad_node_credential_flags(tmp_path: Path, etcd: EtcdServer) -> None:
    cluster = f"etcd://127.0.0.1:{etcd.client_port}"
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    base = ["serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "--node-id", "1"]
    out = run_cli([*base, "--cluster", cluster, "--node-api-key-file", str(bad)])
    assert out.exit_code == 2, out.output
    assert "not a tidewire API key" in out.output
    assert "not a key" not in out.output
    out = run_cli([*base, "--cluster", cluster, "--node-api-key-file", str(tmp_path / "none")])
    assert out.exit_code == 2, out.output
    assert "--node-api-key-file" in out.output
    out = run_cli(["serve", "--data-dir", str(tmp_path / "d"), "--node-api-key-file", str(bad)])
    assert out.exit_code == 2, out.output
    assert "go with --cluster" in out.output
    # TLS to the leaders follows the listener's: --node-tls-* without it is refused.
    out = run_cli([*base, "--cluster", cluster, "--node-tls-ca-file", str(bad)])
    assert out.exit_code != 0, out.output
    assert "listener does not use TLS" in out.output
