"""Users, keys and ACLs replicated across a cluster (``__security``, see
``tidewire.cluster.security``), with three real ``tidewire serve --cluster`` processes and
authentication and TLS on; nodes reach their leaders with a client certificate (CN
tidewire-node).

The first security change (the node principal's ``cluster_action`` grant, made on node 1
with node 1's bootstrap key) creates ``__security`` in etcd with node 1 leading; nodes 2 and
3 drop their own bootstrap state and copy node 1's. Then: a user and key made on the leader
authenticate on the other nodes; a change asked of a follower is answered NotLeader naming
the leader; an ACL removed on the leader refuses on the others; the leader SIGKILLed, the
state survives on the new leader and a change made there (an ACL removed, a key made) holds
on the other survivor. Every wait is bounded; nothing is timed.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli._support import popen_serve, run_cli, stop
from tests.cluster._etcd import EtcdServer
from tests.cluster._nodes import wait_until
from tidewire.client import AsyncClient, Credentials, Message, TlsOptions
from tidewire.errors import (
    AuthenticationFailedError,
    AuthorizationFailedError,
    NotLeaderError,
    TidewireError,
)
from tidewire.protocol.messages import (
    ACKS_DURABLE,
    AclEntry,
    AlterAclsRequest,
    CreateTopicRequest,
    MetadataRequest,
)
from tidewire.security._logs import SECURITY_TOPIC, open_log, security_config
from tidewire.security.certs import issue, make_ca, write_key, write_pem
from tidewire.security.config import SecurityConfig
from tidewire.security.model import Acl, Operation, ResourceType
from tidewire.security.store import SecurityStore
from tidewire.storage import LogManager

T = "orders"
WAIT_S = 60.0


# --- in process: a replica's store follows what it copies ------------------------------------


def test_a_replica_store_applies_copied_records_and_replays_after_a_cut(tmp_path: Path) -> None:
    """What a follower does with ``__security`` (``Broker.replica_appended`` and
    ``replica_truncated`` call these): the records copied from the leader's log, applied as
    they come, give the leader's state; a cut of the log undoes what was above it."""

    async def main() -> None:
        config = SecurityConfig(authentication=True, scram_iterations=4096)
        async with (
            LogManager(str(tmp_path / "leader")) as leader_logs,
            LogManager(str(tmp_path / "follower")) as follower_logs,
        ):
            leader = SecurityStore(leader_logs, config)
            await leader.create_principal("alice")
            _, key = await leader.create_key("alice")
            acl = Acl(
                principal="alice",
                resource_type=ResourceType.TOPIC,
                pattern=T,
                operation=Operation.DESCRIBE,
            )
            await leader.add_acls([acl])
            cut = leader_logs.get_log(SECURITY_TOPIC, 0).log_end_offset
            await leader.remove_acls([acl])
            await leader.delete_principal("alice")

            follower = SecurityStore(follower_logs, config)
            plog = open_log(follower_logs, SECURITY_TOPIC, security_config())
            source = leader_logs.get_log(SECURITY_TOPIC, 0)
            offset = 0
            states = []
            while offset < source.log_end_offset:  # bounded: each read moves on
                r = source.read(offset, 1)  # one batch at a time, as small fetches do
                follower.replica_appended(r.data)
                await plog.append_replica_async(r.data)
                states.append(("alice" in follower.principals, acl in follower.acls))
                offset = r.next_offset
            # principal, key, ACL added, ACL removed, principal deleted
            expected = [(True, False), (True, False), (True, True), (True, False), (False, False)]
            assert states == expected, states
            assert follower.principals.keys() == leader.principals.keys()
            assert follower.keys == leader.keys
            # The leader changed: the copy is cut below the removal and the deletion.
            plog.truncate_to(cut)
            follower.reload()
            assert "alice" in follower.principals
            assert acl in follower.acls
            assert (await follower.verify_key(key)).name == "alice"

    asyncio.run(main())


# --- real processes ------------------------------------------------------------------------------


def _start(data_dir: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    """A node whose log goes to ``DATA_DIR.log`` (read when a test fails)."""
    with open(f"{data_dir}.log", "a") as err:
        proc = popen_serve("--data-dir", str(data_dir), "--port", "0", *args, stderr=err.fileno())
    assert proc.stdout is not None
    line = ""
    for _ in range(5):  # bounded: the listening line comes among the first few
        line = proc.stdout.readline()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m is not None:
            return proc, int(m.group(1))
        if not line:
            break
    stop(proc)
    pytest.fail(f"serve did not start: {line!r}")


class Cluster:
    """Three secured nodes on one etcd; ``cli(n, ...)`` runs the CLI against node n."""

    def __init__(self, tmp_path: Path, etcd: EtcdServer) -> None:
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
        self.ca_file = str(pki / "ca.pem")
        self.tmp_path = tmp_path
        self.procs: dict[int, subprocess.Popen[str]] = {}
        self.addr: dict[int, str] = {}
        #: authentication and TLS, as every node and the single node before the cluster have
        self.secured = [
            "--authentication",
            *("--tls-cert-file", str(pki / "server.pem")),
            *("--tls-key-file", str(pki / "server.key")),
            *("--tls-ca-file", self.ca_file, "--tls-client-auth", "optional"),
        ]
        self.cluster = [
            *("--cluster", f"etcd://127.0.0.1:{etcd.client_port}", "--session-timeout", "2"),
            *("--min-insync-replicas", "2"),
        ]
        #: how a node authenticates to its leaders: the certificate (CN tidewire-node)
        self.identity = [
            *("--node-tls-cert-file", str(pki / "node.pem")),
            *("--node-tls-key-file", str(pki / "node.key")),
        ]

    def start(self, n: int, *, cluster: bool = True) -> None:
        """Node n (``cluster=False``: node n's data directory served as a single node)."""
        args = (
            [*self.secured, *self.cluster, "--node-id", str(n), *self.identity]
            if cluster
            else self.secured
        )
        proc, port = _start(self.tmp_path / f"node{n}", *args)
        self.procs[n] = proc
        self.addr[n] = f"127.0.0.1:{port}"

    def bootstrap_key(self, n: int) -> str:
        return (self.tmp_path / f"node{n}" / "bootstrap-admin.key").read_text().strip()

    def cli(self, n: int, key: str, *args: str) -> tuple[int, str]:
        out = run_cli([*args, "--addr", self.addr[n], "--tls-ca", self.ca_file, "--api-key", key])
        return out.exit_code, out.output

    def client(self, n: int, key: str) -> AsyncClient:
        return AsyncClient(
            self.addr[n],
            credentials=Credentials(key),
            tls=TlsOptions(ca_file=self.ca_file),
            request_timeout_s=30,
        )

    def stop_all(self) -> None:
        for proc in self.procs.values():
            stop(proc)


def _describe(c: Cluster, n: int, key: str) -> str:
    """What ``key`` gets on node n when it describes topic T: "ok", "denied" (authenticated,
    not allowed), "unauthenticated", or another error (a node still joining)."""

    async def main() -> str:
        try:
            async with c.client(n, key) as client:
                await client.describe_topic(T)
        except AuthenticationFailedError:
            return "unauthenticated"
        except AuthorizationFailedError:
            return "denied"
        except (TidewireError, OSError) as exc:  # a node still joining, a connection refused
            return f"error: {exc}"
        return "ok"

    return asyncio.run(main())


def _node_count(c: Cluster, admin: str) -> int:
    async def count() -> int:
        async with c.client(1, admin) as client:
            return len((await client._t.request(MetadataRequest())).body.nodes)

    return asyncio.run(count())


def _create_topic(c: Cluster, admin: str) -> None:
    """Topic T, one partition on the three nodes."""

    async def create() -> None:
        async with c.client(1, admin) as client:
            reply = await client._t.request(
                CreateTopicRequest(name=T, partitions=1, replication_factor=3)
            )
            assert reply.body.error_code == 0, reply.body

    asyncio.run(create())


def _until(what: str, probe: Callable[[], bool]) -> None:
    wait_until(what, lambda: True if probe() else None, WAIT_S)


def _leader_change(c: Cluster, nodes: list[int], key: str, *args: str) -> tuple[int, str]:
    """Make a security change on whichever of ``nodes`` leads ``__security`` (the others
    answer NotLeader): the node it was made on and the CLI's output."""
    result: list[tuple[int, str]] = []

    def attempt() -> bool:
        for n in nodes:
            code, out = c.cli(n, key, *args)
            if code == 0:
                result.append((n, out))
                return True
        return False

    _until(f"{' '.join(args)} made on the leader", attempt)
    return result[0]


def test_users_keys_and_acls_replicate_and_survive_the_leader(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    c = Cluster(tmp_path, etcd)
    try:
        for n in (1, 2, 3):
            c.start(n)
        admin = c.bootstrap_key(1)
        own2 = c.bootstrap_key(2)
        assert own2 != admin

        _until("3 nodes registered", lambda: _node_count(c, admin) == 3)
        # The first change: __security is created with node 1 leading, RF 3; min_insync 2
        # makes it wait for a follower's copy (the grant it carries lets the copy through).
        code, out = c.cli(
            1,
            admin,
            *("acl", "add", "--cluster", "--principal", "tidewire-node"),
            *("--operation", "cluster_action"),
        )
        assert code == 0, out

        _create_topic(c, admin)

        # Node 1's admin now holds on every node; node 2's own bootstrap admin is gone.
        for n in (2, 3):
            _until(f"node 1's admin on node {n}", lambda n=n: _describe(c, n, admin) == "ok")
        assert _describe(c, 2, own2) == "unauthenticated"

        # A user and key made on the leader authenticate on the others.
        code, out = c.cli(1, admin, "user", "create", "alice")
        assert code == 0, out
        code, out = c.cli(1, admin, "key", "create", "alice", "--json")
        assert code == 0, out
        alice = json.loads(out)["api_key"]
        code, out = c.cli(1, admin, "acl", "add", "-p", "alice", "--topic", T, "-o", "describe")
        assert code == 0, out
        for n in (2, 3):
            _until(f"alice allowed on node {n}", lambda n=n: _describe(c, n, alice) == "ok")

        # Changes are made on the leader: a follower asked names it ...
        async def ask_follower() -> tuple[int, str]:
            async with c.client(2, admin) as client:
                entry = AclEntry(
                    principal="alice",
                    resource_type="topic",
                    pattern=T,
                    operation="describe",
                )
                body = (await client._t.request(AlterAclsRequest(remove=[entry]))).body
                return body.error_code, body.error_message

        code, message = asyncio.run(ask_follower())
        assert code == NotLeaderError.code, message
        assert "leader of __security" in message, message
        assert "node 1 at" in message, message

        # ... and the CLI (the client) sends it there itself: an ACL removed through node 2
        # is removed on the leader, and refuses on the others.
        code, out = c.cli(2, admin, "acl", "remove", "-p", "alice", "--topic", T, "-o", "describe")
        assert code == 0, out
        assert out.startswith("removed 1 ACL entry"), out
        for n in (2, 3):
            _until(f"alice refused on node {n}", lambda n=n: _describe(c, n, alice) == "denied")
        code, out = c.cli(1, admin, "acl", "add", "-p", "alice", "--topic", T, "-o", "describe")
        assert code == 0, out

        # The leader of __security killed: the state survives on the new leader, and a change
        # made there holds on the other survivor.
        stop(c.procs.pop(1))
        lead, out = _leader_change(
            c, [2, 3], admin, "acl", "remove", "-p", "alice", "--topic", T, "-o", "describe"
        )
        assert out.startswith("removed 1 ACL entry"), out  # the new leader had the grant
        other = 5 - lead
        _until(f"alice refused on node {other}", lambda: _describe(c, other, alice) == "denied")
        code, out = c.cli(lead, admin, "key", "create", "alice", "--json")
        assert code == 0, out
        second = json.loads(out)["api_key"]
        _until(
            f"the new key known on node {other}",
            lambda: _describe(c, other, second) == "denied",  # authenticated, not allowed
        )

        # Node 1 restarted copies what changed while it was away.
        c.start(1)
        _until("node 1 caught up", lambda: _describe(c, 1, second) == "denied")

        # A node that joins later is made a replica of __security by its leader: it copies
        # the cluster's state (its own bootstrap admin goes) and authenticates like the rest.
        c.start(4)
        own4 = c.bootstrap_key(4)
        _until("node 4 holds the cluster's keys", lambda: _describe(c, 4, second) == "denied")
        assert _describe(c, 4, admin) == "ok"
        assert _describe(c, 4, own4) == "unauthenticated"
    finally:
        c.stop_all()


@pytest.mark.slow
def test_a_node_key_prepared_before_the_cluster_forms_replicates_the_state(
    tmp_path: Path, etcd: EtcdServer
) -> None:
    """The procedure of docs/cluster.md for nodes identified by a key: node 1, served alone
    first, makes the node principal, its key and the grant; every node then starts in the
    cluster with that key file; the grant repeated on node 1 (it changes nothing) makes node
    1's state the cluster's, which the others copy authenticated with the key, after which
    an acks=all produce (min_insync 2) is answered."""
    c = Cluster(tmp_path, etcd)
    try:
        c.start(1, cluster=False)
        admin = c.bootstrap_key(1)
        for args in (
            ("user", "create", "tidewire-node", "--service"),
            ("acl", "add", "--cluster", "--principal", "tidewire-node", "-o", "cluster_action"),
        ):
            code, out = c.cli(1, admin, *args)
            assert code == 0, out
        code, out = c.cli(1, admin, "key", "create", "tidewire-node", "--json")
        assert code == 0, out
        node_key = tmp_path / "node.key"
        node_key.write_text(json.loads(out)["api_key"] + "\n")
        stop(c.procs.pop(1))

        c.identity = ["--node-api-key-file", str(node_key)]
        for n in (1, 2, 3):
            c.start(n)
        _until("3 nodes registered", lambda: _node_count(c, admin) == 3)
        code, out = c.cli(
            1,
            admin,
            "acl",
            "add",
            "--cluster",
            "--principal",
            "tidewire-node",
            *("-o", "cluster_action"),
        )
        assert code == 0, out
        assert "added 0" in out, out  # it existed: nothing changed but the state's home
        _create_topic(c, admin)
        for n in (2, 3):
            _until(f"node 1's admin on node {n}", lambda n=n: _describe(c, n, admin) == "ok")

        async def produce() -> int:
            async with c.client(1, admin) as client:
                return await client.produce(T, 0, [Message(b"x")], acks=ACKS_DURABLE)

        def produced() -> bool:
            try:
                return asyncio.run(produce()) >= 0
            except TidewireError:
                return False

        _until("an acks=all produce answered", produced)
    finally:
        c.stop_all()
