"""Every binary API against the gate, generated from the API registry (as Kafka's
AuthorizerIntegrationTest): for each API, without credentials it is refused
(AUTHENTICATION_FAILED), with credentials but without the permission it declares it is refused
(AUTHORIZATION_FAILED) and nothing changed, and with exactly those permissions the gate lets
it through. An API without a declaration in server/needs.py, or without a sample request
here, fails the test."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tidewire.broker import Broker, BrokerConfig
from tidewire.client import AsyncClient
from tidewire.errors import (
    AuthenticationFailedError,
    AuthorizationFailedError,
    TidewireError,
)
from tidewire.protocol import messages as sec
from tidewire.protocol.messages import (
    _SCHEMAS,
    AlterTopicRequest,
    ApiKey,
    ApiVersionsRequest,
    Body,
    CommitPartition,
    CreateTopicRequest,
    CreditRequest,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DescribeAuditRequest,
    DescribeGroupRequest,
    DescribeTopicRequest,
    FetchPartition,
    FetchRequest,
    GroupPartition,
    HeartbeatRequest,
    InitProducerIdRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListTopicsRequest,
    MetadataRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    PingRequest,
    ProducePartition,
    ProduceRequest,
    ProducerStateRequest,
    ReleaseWritersRequest,
    RepairTopicRequest,
    ResetOffsetsRequest,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
    SubscribePartition,
    SubscribeRequest,
    UnsubscribeRequest,
    WhoAmIRequest,
)
from tidewire.records import BatchBuilder
from tidewire.security.config import SecurityConfig
from tidewire.security.credentials import Credentials
from tidewire.security.model import Acl, ResourceType
from tidewire.server import TcpServer
from tidewire.server.needs import API_NEEDS, AUTHENTICATED, PUBLIC
from tidewire.server.tcp import ServerConfig

TOPIC, GROUP = "matrix", "matrix-group"


def _batch() -> bytes:
    b = BatchBuilder()
    b.append(b"value", timestamp_ms=0)
    return bytes(b.build())


#: A request of every API, as (body, data section).
SAMPLES: dict[ApiKey, Callable[[], tuple[Body, list[bytes]]]] = {
    ApiKey.API_VERSIONS: lambda: (ApiVersionsRequest(), []),
    ApiKey.SASL_HANDSHAKE: lambda: (SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), []),
    ApiKey.SASL_AUTHENTICATE: lambda: (SaslAuthenticateRequest(auth_bytes=b"n,,n=x,r=y"), []),
    ApiKey.WHOAMI: lambda: (WhoAmIRequest(), []),
    ApiKey.PING: lambda: (PingRequest(), []),
    ApiKey.METADATA: lambda: (MetadataRequest(topics=[TOPIC]), []),
    ApiKey.CREATE_TOPIC: lambda: (CreateTopicRequest(name="matrix-new", partitions=1), []),
    ApiKey.DELETE_TOPIC: lambda: (DeleteTopicRequest(name=TOPIC), []),
    ApiKey.LIST_TOPICS: lambda: (ListTopicsRequest(), []),
    ApiKey.DESCRIBE_TOPIC: lambda: (DescribeTopicRequest(name=TOPIC), []),
    ApiKey.ALTER_TOPIC: lambda: (AlterTopicRequest(name=TOPIC, partitions=2), []),
    ApiKey.REPAIR_TOPIC: lambda: (RepairTopicRequest(name=TOPIC), []),
    ApiKey.PRODUCE: lambda: (
        ProduceRequest(partitions=[ProducePartition(TOPIC, 0, len(_batch()))]),
        [_batch()],
    ),
    ApiKey.FETCH: lambda: (
        FetchRequest(max_wait_ms=0, partitions=[FetchPartition(TOPIC, 0, 0, 65536)]),
        [],
    ),
    ApiKey.LIST_OFFSETS: lambda: (
        ListOffsetsRequest(partitions=[ListOffsetsPartition(TOPIC, 0, -1)]),
        [],
    ),
    ApiKey.INIT_PRODUCER_ID: lambda: (InitProducerIdRequest(), []),
    ApiKey.PRODUCER_STATE: lambda: (
        ProducerStateRequest(producer_id=1, partitions=[GroupPartition(TOPIC, 0)]),
        [],
    ),
    ApiKey.RELEASE_WRITERS: lambda: (ReleaseWritersRequest(writer_ids=["w"]), []),
    ApiKey.JOIN_GROUP: lambda: (
        JoinGroupRequest(group_id=GROUP, topics=[TOPIC], session_timeout_ms=6000),
        [],
    ),
    ApiKey.HEARTBEAT: lambda: (HeartbeatRequest(group_id=GROUP, member_id="m", generation=1), []),
    ApiKey.LEAVE_GROUP: lambda: (LeaveGroupRequest(group_id=GROUP, member_id="m"), []),
    ApiKey.OFFSET_COMMIT: lambda: (
        OffsetCommitRequest(group_id=GROUP, partitions=[CommitPartition(TOPIC, 0, 0)]),
        [],
    ),
    ApiKey.OFFSET_FETCH: lambda: (
        OffsetFetchRequest(group_id=GROUP, partitions=[GroupPartition(TOPIC, 0)]),
        [],
    ),
    ApiKey.LIST_GROUPS: lambda: (ListGroupsRequest(), []),
    ApiKey.DESCRIBE_GROUP: lambda: (DescribeGroupRequest(group_id=GROUP), []),
    ApiKey.DELETE_GROUP: lambda: (DeleteGroupRequest(group_id=GROUP), []),
    ApiKey.RESET_OFFSETS: lambda: (
        ResetOffsetsRequest(group_id=GROUP, topic=TOPIC, to="earliest"),
        [],
    ),
    ApiKey.SUBSCRIBE: lambda: (
        SubscribeRequest(partitions=[SubscribePartition(TOPIC, 0, 0)], credit_bytes=65536),
        [],
    ),
    ApiKey.CREDIT: lambda: (CreditRequest(subscription_id=1, credit_bytes=1), []),
    ApiKey.DESCRIBE_AUDIT: lambda: (DescribeAuditRequest(limit=10), []),
    ApiKey.UNSUBSCRIBE: lambda: (UnsubscribeRequest(subscription_id=1), []),
    # Security administration (on another principal than the caller: a principal's own keys
    # need no permission, see test_admin_api).
    ApiKey.CREATE_PRINCIPAL: lambda: (sec.CreatePrincipalRequest(name="matrix-p"), []),
    ApiKey.DELETE_PRINCIPAL: lambda: (sec.DeletePrincipalRequest(name="admin"), []),
    ApiKey.DESCRIBE_PRINCIPALS: lambda: (sec.DescribePrincipalsRequest(), []),
    ApiKey.ALTER_PRINCIPAL: lambda: (
        sec.AlterPrincipalRequest(name="admin", description="changed"),
        [],
    ),
    ApiKey.CREATE_API_KEY: lambda: (sec.CreateApiKeyRequest(principal="admin"), []),
    ApiKey.REVOKE_API_KEY: lambda: (sec.RevokeApiKeyRequest(key_id="0123456789ab"), []),
    ApiKey.ALTER_ACLS: lambda: (
        sec.AlterAclsRequest(
            add=[
                sec.AclEntry(
                    principal="nobody",
                    resource_type="cluster",
                    pattern="cluster",
                    operation="all",
                )
            ]
        ),
        [],
    ),
    ApiKey.DESCRIBE_ACLS: lambda: (sec.DescribeAclsRequest(), []),
    ApiKey.ALTER_QUOTAS: lambda: (sec.AlterQuotasRequest(clear_quotas=["admin"]), []),
    ApiKey.DESCRIBE_QUOTAS: lambda: (sec.DescribeQuotasRequest(), []),
    # Queues and exchanges.
    ApiKey.EXCHANGE_DECLARE: lambda: (sec.ExchangeDeclareRequest(name="matrix-x"), []),
    ApiKey.EXCHANGE_DELETE: lambda: (sec.ExchangeDeleteRequest(name="matrix-x"), []),
    ApiKey.QUEUE_DECLARE: lambda: (sec.QueueDeclareRequest(name="matrix-q"), []),
    ApiKey.QUEUE_DELETE: lambda: (sec.QueueDeleteRequest(name="matrix-q"), []),
    ApiKey.QUEUE_PURGE: lambda: (sec.QueuePurgeRequest(name="matrix-q"), []),
    ApiKey.QUEUE_BIND: lambda: (
        sec.QueueBindRequest(exchange="matrix-x", destination="matrix-q", key="k"),
        [],
    ),
    ApiKey.QUEUE_UNBIND: lambda: (
        sec.QueueUnbindRequest(exchange="matrix-x", destination="matrix-q", key="k"),
        [],
    ),
    ApiKey.LIST_QUEUES: lambda: (sec.ListQueuesRequest(), []),
    ApiKey.LIST_EXCHANGES: lambda: (sec.ListExchangesRequest(), []),
    ApiKey.QUEUE_PUBLISH: lambda: (
        sec.QueuePublishRequest(exchange="", routing_key="matrix-q"),
        [_batch()],
    ),
    ApiKey.QUEUE_CONSUME: lambda: (sec.QueueConsumeRequest(queue="matrix-q"), []),
    ApiKey.QUEUE_CANCEL: lambda: (sec.QueueCancelRequest(queue="matrix-q", consumer_tag="c"), []),
    ApiKey.QUEUE_GET: lambda: (sec.QueueGetRequest(queue="matrix-q"), []),
    ApiKey.QUEUE_SETTLE: lambda: (sec.QueueSettleRequest(queue="matrix-q", tags=[1]), []),
    ApiKey.QUEUE_BROWSE: lambda: (sec.QueueBrowseRequest(queue="matrix-q"), []),
    ApiKey.QUEUE_REPLAY: lambda: (sec.QueueReplayRequest(queue="matrix-q"), []),
    # Lightweight streams (by stream id).
    ApiKey.STREAM_SEND: lambda: (
        sec.StreamSendRequest(
            items=[sec.SendItem("matrix-s", b"v"), sec.SendItem("matrix-t", b"w")]
        ),
        [],
    ),
    ApiKey.STREAM_RECEIVE: lambda: (sec.StreamReceiveRequest(streams=["matrix-s", "matrix-t"]), []),
    ApiKey.STREAM_READ: lambda: (sec.StreamReadRequest(positions={"matrix-s": ""}), []),
    ApiKey.STREAM_LIST: lambda: (sec.StreamListRequest(), []),
    ApiKey.STREAM_DESCRIBE: lambda: (sec.StreamDescribeRequest(stream="matrix-s"), []),
    # Between cluster nodes (a single node refuses it once the gate let it through).
    ApiKey.REPLICA_FETCH: lambda: (
        sec.ReplicaFetchRequest(
            node_id=2, max_wait_ms=0, partitions=[sec.ReplicaFetchPartition(TOPIC, 0, 0, 0)]
        ),
        [],
    ),
    # A cluster topic's replication (a single node refuses it once the gate let it through).
    ApiKey.ALTER_REPLICATION: lambda: (
        sec.AlterReplicationRequest(topic=TOPIC, replication_factor=2),
        [],
    ),
    # The msgbus mode's pop, taken on the leader: a read and a group commit.
    ApiKey.TAKE: lambda: (sec.TakeRequest(topic=TOPIC, group=GROUP), []),
    # An HTTP API publish forwarded to the leader: a write.
    ApiKey.HTTP_PUBLISH: lambda: (
        sec.HttpPublishRequest(topic=TOPIC, body=b'{"value":"v"}', idempotency_key="k"),
        [],
    ),
    # A cluster's figures (refused on a single node, after the gate).
    ApiKey.CLUSTER_METRICS: lambda: (sec.ClusterMetricsRequest(), []),
    # A node forwarding a caller's request (cluster_action; the inner request is checked as
    # the caller it carries, the matrix's admin here).
    ApiKey.ENVELOPE: lambda: (
        sec.EnvelopeRequest(
            request_api_key=int(ApiKey.QUEUE_BROWSE),
            request_body=sec.encode_body(sec.QueueBrowseRequest(queue="matrix-q")),
            principal="admin",
        ),
        [],
    ),
}


def test_every_api_declares_what_it_needs_and_has_a_sample() -> None:
    apis = set(_SCHEMAS)
    assert apis - set(API_NEEDS) == set(), "APIs without a permission declared in needs.py"
    assert set(API_NEEDS) - apis == set()
    assert apis - set(SAMPLES) == set(), "APIs without a sample request in this test"


async def _state(broker: Broker) -> Any:
    """What a refused request must leave as it was."""
    topics = broker.topics()
    ends = {
        (t, p): broker.logs.logs[(t, p)].log_end_offset
        for t, n in topics.items()
        for p in range(n)
        if (t, p) in broker.logs.logs
    }
    groups = sorted(g.group_id for g in broker.groups.list_groups())
    queues = sorted(
        (q.spec.name, q.ready, q.unacked, q.consumers, q.counters.published)
        for q in broker.queues.queues()
    )
    exchanges = sorted(x.name for x in broker.queues.exchanges())
    bindings = sorted(map(repr, broker.queues.bindings()))
    return topics, ends, groups, queues, exchanges, bindings, broker.security.version


def _code(exc: BaseException | None) -> int:
    return exc.code if isinstance(exc, TidewireError) else 0


async def _call(client: AsyncClient, body: Body, data: list[bytes]) -> BaseException | None:
    try:
        await client._t.request(body, data, timeout_s=15)
    except TidewireError as exc:
        return exc
    return None


GATED = sorted(
    (k for k, r in API_NEEDS.items() if r is not PUBLIC),
    key=int,
)


@pytest.mark.parametrize("api", GATED, ids=lambda k: k.name)
def test_the_gate_refuses_without_credentials_and_without_the_permission_and_allows_with_it(
    tmp_path: Path, api: ApiKey
) -> None:
    async def main() -> None:
        config = SecurityConfig(authentication=True, superusers="admin")
        broker = Broker(BrokerConfig(str(tmp_path / "data")), security=config)
        await broker.start()
        server = TcpServer(broker, ServerConfig(port=0))
        await server.start()
        addr = f"127.0.0.1:{server.port}"
        try:
            assert broker.bootstrap_key_file is not None
            admin = Credentials(broker.bootstrap_key_file.read_text().strip())
            async with AsyncClient(addr, credentials=admin) as c:
                await c.create_topic(TOPIC, partitions=1)
                await c.declare_exchange("matrix-x")
                await c.declare_queue("matrix-q")
                await c.bind("matrix-x", "matrix-q", "k")
                await c.publish("", "matrix-q", b"ready")
            await broker.security.create_principal("nobody")
            _, key = await broker.security.create_key("nobody")
            body, data = SAMPLES[api]()

            # 1. no credentials
            async with AsyncClient(addr) as anon:
                before = await _state(broker)
                exc = await _call(anon, body, data)
                assert isinstance(exc, AuthenticationFailedError), exc
                assert await _state(broker) == before

            requirement = API_NEEDS[api]
            async with AsyncClient(addr, credentials=Credentials(key)) as user:
                if requirement is not AUTHENTICATED:
                    # 2. authenticated, no permission: refused, nothing changed
                    before = await _state(broker)
                    exc = await _call(user, body, data)
                    assert isinstance(exc, AuthorizationFailedError), exc
                    assert await _state(broker) == before
                    # 3. exactly the declared permissions: the gate lets it through
                    assert callable(requirement)
                    needs = [n for n in requirement(body) if not n.if_missing]
                    assert needs, f"{api.name} declares no permission"
                    await broker.security.add_acls(
                        Acl(
                            principal="nobody",
                            resource_type=n.resource,
                            pattern=n.name,
                            operation=n.operation,
                        )
                        for n in needs
                    )
                exc = await _call(user, body, data)
                assert _code(exc) not in (
                    AuthenticationFailedError.code,
                    AuthorizationFailedError.code,
                ), exc
        finally:
            await server.close()
            await broker.close()

    asyncio.run(main())


def test_resource_types_of_later_kinds_exist_for_acls() -> None:
    assert {r.value for r in ResourceType} >= {
        "topic",
        "group",
        "cluster",
        "queue",
        "exchange",
        "stream",
    }
