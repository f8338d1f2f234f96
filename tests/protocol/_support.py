"""Shared pieces of the protocol tests: a sample request and response for every API,
hypothesis strategies for every schema, and the plumbing that carries bytes from one
:class:`Connection` to another (whole or byte by byte)."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

import msgspec
from hypothesis import strategies as st

from tidewire.protocol import NEED_DATA, PAUSED, Connection, ConnectionClosed
from tidewire.protocol import messages as q
from tidewire.protocol import messages as sec
from tidewire.protocol.frames import Buffer
from tidewire.protocol.messages import (
    PUSH_SCHEMAS,
    AlterTopicRequest,
    AlterTopicResponse,
    ApiKey,
    ApiVersionsRequest,
    ApiVersionsResponse,
    AuditEventBody,
    Body,
    CommitPartition,
    CommittedOffset,
    CreateTopicRequest,
    CreateTopicResponse,
    CreditRequest,
    CreditResponse,
    DeleteGroupRequest,
    DeleteGroupResponse,
    DeleteTopicRequest,
    DeleteTopicResponse,
    DescribeAuditRequest,
    DescribeAuditResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    DescribeTopicRequest,
    DescribeTopicResponse,
    FetchPartition,
    FetchPartitionResult,
    FetchRequest,
    FetchResponse,
    GroupMember,
    GroupPartition,
    GroupPartitionLag,
    GroupSummary,
    HeartbeatRequest,
    HeartbeatResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsResult,
    ListTopicsRequest,
    ListTopicsResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionInfo,
    PartitionResult,
    PingRequest,
    PingResponse,
    ProducePartition,
    ProducePartitionResult,
    ProduceRequest,
    ProduceResponse,
    ProducerPartitionState,
    ProducerStateRequest,
    ProducerStateResponse,
    ReleaseWritersRequest,
    ReleaseWritersResponse,
    RepairResult,
    RepairTopicRequest,
    RepairTopicResponse,
    ResetOffsetResult,
    ResetOffsetsRequest,
    ResetOffsetsResponse,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
    StorageProblem,
    SubscribePartition,
    SubscribeRequest,
    SubscribeResponse,
    TopicConfig,
    TopicDescription,
    UnsubscribeRequest,
    UnsubscribeResponse,
    WhoAmIRequest,
    WhoAmIResponse,
    schema_for,
    supported_versions,
)

# --- sample bodies --------------------------------------------------------------------------------

_STREAM_MESSAGES = [
    q.StreamMessage("a", b"one", "", 1_700_000_000_000, 1_700_086_400_000),
    q.StreamMessage("b", b"two", "u-2", 1_700_000_000_001, 1_700_000_005_001, "AQAAAAAAAAAA"),
]
_STREAM_INFO = q.StreamInfo(
    stream="user/42",
    partition=3,
    waiting=2,
    persistent=1,
    in_memory=1,
    receivers=0,
    ring_size=100,
    first_token="AQ",
    end_token="AR",
    oldest_ms=1_700_000_000_000,
    newest_ms=1_700_000_000_001,
)

_CONFIG = TopicConfig(retention_ms=86_400_000, segment_bytes=1 << 20, fsync="always")
_DESCRIPTION = TopicDescription(
    name="orders",
    partitions=[
        PartitionInfo(
            partition=0, log_start_offset=0, log_end_offset=10, high_watermark=10, size_bytes=700
        ),
        PartitionInfo(
            partition=1,
            log_start_offset=-1,
            log_end_offset=-1,
            high_watermark=-1,
            size_bytes=0,
            error_code=32,
            error_message="corrupt at offset 4",
        ),
    ],
    config=_CONFIG,
)

#: One request and one response per API, with every nested schema used at least once.
SAMPLES: dict[ApiKey, tuple[Body, Body]] = {
    ApiKey.API_VERSIONS: (
        ApiVersionsRequest(client_name="tests", client_version="0.1"),
        ApiVersionsResponse(server_version="0.1.0", apis=supported_versions()),
    ),
    ApiKey.METADATA: (
        MetadataRequest(topics=["orders", "ünïcode"]),
        MetadataResponse(broker_id=1, host="localhost", port=9092, topics=[_DESCRIPTION]),
    ),
    ApiKey.CREATE_TOPIC: (
        CreateTopicRequest(name="orders", partitions=3, config=_CONFIG),
        CreateTopicResponse(error_code=36, error_message="exists"),
    ),
    ApiKey.DELETE_TOPIC: (DeleteTopicRequest(name="orders"), DeleteTopicResponse()),
    ApiKey.LIST_TOPICS: (ListTopicsRequest(), ListTopicsResponse(topics=["a", "b"])),
    ApiKey.DESCRIBE_TOPIC: (
        DescribeTopicRequest(name="orders"),
        DescribeTopicResponse(topic=_DESCRIPTION),
    ),
    ApiKey.ALTER_TOPIC: (
        AlterTopicRequest(name="orders", partitions=6, config=TopicConfig(retention_bytes=-1)),
        AlterTopicResponse(),
    ),
    ApiKey.PRODUCE: (
        ProduceRequest(
            acks=1,
            timeout_ms=1_000,
            partitions=[ProducePartition("orders", 0, 5), ProducePartition("orders", 2, 3)],
        ),
        ProduceResponse(
            results=[
                ProducePartitionResult(topic="orders", partition=0, base_offset=41),
                ProducePartitionResult(
                    topic="orders", partition=2, error_code=19, error_message="too large"
                ),
            ]
        ),
    ),
    ApiKey.FETCH: (
        FetchRequest(
            max_wait_ms=0, partitions=[FetchPartition("orders", 0, offset=41, max_bytes=4096)]
        ),
        FetchResponse(
            partitions=[
                FetchPartitionResult(topic="orders", partition=0, size=8, high_watermark=42),
                FetchPartitionResult(
                    topic="orders",
                    partition=1,
                    error_code=32,
                    error_message="damaged",
                    damage_start=7,
                    damage_end=9,
                ),
            ]
        ),
    ),
    ApiKey.LIST_OFFSETS: (
        ListOffsetsRequest(partitions=[ListOffsetsPartition("orders", 0, -2)]),
        ListOffsetsResponse(results=[ListOffsetsResult(topic="orders", partition=0, offset=0)]),
    ),
    ApiKey.INIT_PRODUCER_ID: (
        InitProducerIdRequest(writer_id="q/7b2e/12/0"),
        InitProducerIdResponse(producer_id=7, producer_epoch=0),
    ),
    ApiKey.PING: (
        PingRequest(storage=True),
        PingResponse(
            problems=[
                StorageProblem(topic="orders", partition=2, kind="offline", reason="bad JSON")
            ],
            problems_total=1,
        ),
    ),
    ApiKey.JOIN_GROUP: (
        JoinGroupRequest(group_id="g", topics=["orders"], pattern="ord.*", strategy="range"),
        JoinGroupResponse(
            member_id="m-1",
            generation=3,
            strategy="range",
            members=2,
            assignment=[GroupPartition("orders", 0)],
        ),
    ),
    ApiKey.HEARTBEAT: (
        HeartbeatRequest(group_id="g", member_id="m-1", generation=3),
        HeartbeatResponse(error_code=83, error_message="rebalancing"),
    ),
    ApiKey.LEAVE_GROUP: (LeaveGroupRequest(group_id="g", member_id="m-1"), LeaveGroupResponse()),
    ApiKey.OFFSET_COMMIT: (
        OffsetCommitRequest(
            group_id="g",
            member_id="m-1",
            generation=3,
            partitions=[CommitPartition("orders", 0, 42, "meta")],
        ),
        OffsetCommitResponse(results=[PartitionResult(topic="orders", partition=0)]),
    ),
    ApiKey.OFFSET_FETCH: (
        OffsetFetchRequest(group_id="g", partitions=[GroupPartition("orders", 0)]),
        OffsetFetchResponse(offsets=[CommittedOffset(topic="orders", partition=0, offset=42)]),
    ),
    ApiKey.LIST_GROUPS: (
        ListGroupsRequest(),
        ListGroupsResponse(groups=[GroupSummary(group_id="g", state="stable", members=2)]),
    ),
    ApiKey.DESCRIBE_GROUP: (
        DescribeGroupRequest(group_id="g"),
        DescribeGroupResponse(
            group_id="g",
            state="stable",
            generation=3,
            strategy="sticky",
            members=[
                GroupMember(
                    member_id="m-1", topics=["orders"], assignment=[GroupPartition("orders", 0)]
                )
            ],
            offsets=[
                GroupPartitionLag(topic="orders", partition=0, committed=42, end_offset=50, lag=8)
            ],
        ),
    ),
    ApiKey.DELETE_GROUP: (DeleteGroupRequest(group_id="g"), DeleteGroupResponse()),
    ApiKey.RESET_OFFSETS: (
        ResetOffsetsRequest(group_id="g", topic="orders", to="timestamp", value=1, dry_run=True),
        ResetOffsetsResponse(
            results=[ResetOffsetResult(topic="orders", partition=0, previous=42, offset=7)]
        ),
    ),
    ApiKey.SUBSCRIBE: (
        SubscribeRequest(
            subscription_id=7,
            partitions=[SubscribePartition("orders", 0, 42)],
            credit_bytes=1 << 20,
            best_effort=True,
            max_lag_bytes=4096,
        ),
        SubscribeResponse(
            subscription_id=7, results=[PartitionResult(topic="orders", partition=0)]
        ),
    ),
    ApiKey.CREDIT: (CreditRequest(subscription_id=7, credit_bytes=65536), CreditResponse()),
    ApiKey.UNSUBSCRIBE: (UnsubscribeRequest(subscription_id=7), UnsubscribeResponse()),
    ApiKey.PRODUCER_STATE: (
        ProducerStateRequest(
            producer_id=(1 << 62) + 5, producer_epoch=2, partitions=[GroupPartition("orders", 0)]
        ),
        ProducerStateResponse(
            results=[
                ProducerPartitionState(
                    topic="orders", partition=0, producer_epoch=1, last_sequence=99
                )
            ]
        ),
    ),
    ApiKey.RELEASE_WRITERS: (
        ReleaseWritersRequest(writer_ids=["q/7b2e/12/0", "q/7b2e/12/1"]),
        ReleaseWritersResponse(released=3),
    ),
    ApiKey.REPAIR_TOPIC: (
        RepairTopicRequest(name="orders", partition=1, action="quarantine"),
        RepairTopicResponse(
            results=[
                RepairResult(
                    partition=1,
                    start=40,
                    end=45,
                    size_bytes=310,
                    action="quarantined",
                    file="/data/orders-1/00000000000000000040-00000000000000000045.quarantined",
                    reason="CRC-32C mismatch",
                )
            ]
        ),
    ),
    ApiKey.SASL_HANDSHAKE: (
        SaslHandshakeRequest(mechanism="SCRAM-SHA-256"),
        SaslHandshakeResponse(mechanisms=["SCRAM-SHA-256", "SCRAM-SHA-512"]),
    ),
    ApiKey.SASL_AUTHENTICATE: (
        SaslAuthenticateRequest(auth_bytes=b"n,,n=0123456789ab,r=nonce"),
        SaslAuthenticateResponse(auth_bytes=b"v=c2lnbmF0dXJl", principal="alice", complete=True),
    ),
    ApiKey.WHOAMI: (
        WhoAmIRequest(),
        WhoAmIResponse(
            principal="alice",
            kind="user",
            roles=["producer"],
            mechanism="SCRAM-SHA-256",
            tls=True,
            authentication=True,
        ),
    ),
    ApiKey.DESCRIBE_AUDIT: (
        DescribeAuditRequest(since_ms=1_714_564_800_000, principal="alice", outcome="denied"),
        DescribeAuditResponse(
            events=[
                AuditEventBody(
                    time_ms=1_714_564_800_123,
                    principal="alice",
                    source="10.0.0.7:51234",
                    interface="binary",
                    action="PRODUCE",
                    resource="topic:orders",
                    outcome="denied",
                    reason="no ACL allows write on topic:orders",
                    detail={"partition": "0"},
                )
            ]
        ),
    ),
}

# Security administration.
_KEY = sec.ApiKeyInfo(
    id="0123456789ab", principal="alice", state="active", created_ms=1, description="ci"
)
_ACL = sec.AclEntry(
    principal="role:ops",
    resource_type="topic",
    pattern="logs.",
    pattern_type="prefix",
    operation="write",
)
_ALICE = sec.PrincipalInfo(name="alice", roles=["producer"], created_ms=1, keys=[_KEY])
_QUOTA = sec.QuotaEntry(principal="alice", produce_bytes_per_s=1024, requests_per_s=-1)
SAMPLES.update(
    {
        ApiKey.CREATE_PRINCIPAL: (
            sec.CreatePrincipalRequest(name="alice", kind="service", roles=["producer"]),
            sec.CreatePrincipalResponse(principal=_ALICE),
        ),
        ApiKey.DELETE_PRINCIPAL: (
            sec.DeletePrincipalRequest(name="alice"),
            sec.DeletePrincipalResponse(keys_deleted=2, acls_deleted=1),
        ),
        ApiKey.DESCRIBE_PRINCIPALS: (
            sec.DescribePrincipalsRequest(names=["alice"]),
            sec.DescribePrincipalsResponse(principals=[_ALICE]),
        ),
        ApiKey.ALTER_PRINCIPAL: (
            sec.AlterPrincipalRequest(name="alice", roles=["viewer"], description="x"),
            sec.AlterPrincipalResponse(error_code=104, error_message="no principal named 'x'"),
        ),
        ApiKey.CREATE_API_KEY: (
            sec.CreateApiKeyRequest(principal="alice", expires_ms=2, description="ci"),
            sec.CreateApiKeyResponse(key=_KEY, secret_key="twk_0123456789ab_" + "A" * 43),
        ),
        ApiKey.REVOKE_API_KEY: (
            sec.RevokeApiKeyRequest(key_id="0123456789ab", principal="alice"),
            sec.RevokeApiKeyResponse(key=_KEY),
        ),
        ApiKey.ALTER_ACLS: (
            sec.AlterAclsRequest(add=[_ACL], remove=[_ACL]),
            sec.AlterAclsResponse(added=[_ACL]),
        ),
        ApiKey.DESCRIBE_ACLS: (
            sec.DescribeAclsRequest(principal="role:ops", matching="logs.app"),
            sec.DescribeAclsResponse(acls=[_ACL]),
        ),
        ApiKey.ALTER_QUOTAS: (
            sec.AlterQuotasRequest(set_quotas=[_QUOTA], clear_quotas=["bob"]),
            sec.AlterQuotasResponse(quotas=[_QUOTA]),
        ),
        ApiKey.DESCRIBE_QUOTAS: (
            sec.DescribeQuotasRequest(principals=["alice"]),
            sec.DescribeQuotasResponse(quotas=[_QUOTA], defaults=_QUOTA),
        ),
    }
)

_QUEUE_INFO = q.QueueInfo(
    name="orders",
    max_deliveries=5,
    overflow="drop-head",
    dead_letter_exchange="",
    ready=3,
    unacked=2,
    delayed=1,
    bytes=420,
    consumers=1,
    counters=q.QueueCountersInfo(published=6, delivered=3, redelivered=1),
)
_ENTRIES = [q.DeliveryEntryInfo(7, 40, 1), q.DeliveryEntryInfo(8, 42, 3)]
SAMPLES.update(
    {
        ApiKey.EXCHANGE_DECLARE: (
            q.ExchangeDeclareRequest(name="events", type="topic", alternate_exchange="ae"),
            q.ExchangeDeclareResponse(error_code=112, error_message="type differs"),
        ),
        ApiKey.EXCHANGE_DELETE: (
            q.ExchangeDeleteRequest(name="events", if_unused=True),
            q.ExchangeDeleteResponse(),
        ),
        ApiKey.QUEUE_DECLARE: (
            q.QueueDeclareRequest(
                name="orders",
                durable=False,
                exclusive=True,
                max_length=10,
                overflow="drop-head",
                dead_letter_exchange="dlx",
                dead_letter_routing_key="dead",
                visibility_timeout_ms=30_000,
            ),
            q.QueueDeclareResponse(queue=_QUEUE_INFO),
        ),
        ApiKey.QUEUE_DELETE: (
            q.QueueDeleteRequest(name="orders", if_empty=True, if_unused=True),
            q.QueueDeleteResponse(messages=4),
        ),
        ApiKey.QUEUE_PURGE: (q.QueuePurgeRequest(name="orders"), q.QueuePurgeResponse(messages=3)),
        ApiKey.QUEUE_BIND: (
            q.QueueBindRequest(
                exchange="h", destination="orders", arguments={"x-match": "any", "k": "v"}
            ),
            q.QueueBindResponse(),
        ),
        ApiKey.QUEUE_UNBIND: (
            q.QueueUnbindRequest(
                exchange="e", destination="t", destination_kind="topic", key="a.#"
            ),
            q.QueueUnbindResponse(error_code=111, error_message="no exchange named 'e'"),
        ),
        ApiKey.LIST_QUEUES: (q.ListQueuesRequest(), q.ListQueuesResponse(queues=[_QUEUE_INFO])),
        ApiKey.LIST_EXCHANGES: (
            q.ListExchangesRequest(),
            q.ListExchangesResponse(
                exchanges=[q.ExchangeInfo(name=""), q.ExchangeInfo(name="t", type="topic")],
                bindings=[q.BindingInfo(exchange="t", destination="orders", key="*.eu")],
            ),
        ),
        ApiKey.QUEUE_PUBLISH: (
            q.QueuePublishRequest(
                exchange="t",
                routing_key="order.eu",
                headers={"kind": "order"},
                mandatory=True,
                ttl_ms=60_000,
                deliver_at_ms=1_700_000_000_000,
                delay_ms=5,
            ),
            q.QueuePublishResponse(
                queues=["orders", "audit"], topics=[q.TopicOffset("log", 0, 17)]
            ),
        ),
        ApiKey.QUEUE_CONSUME: (
            q.QueueConsumeRequest(queue="orders", prefetch=10, consumer_tag="c1"),
            q.QueueConsumeResponse(consumer_tag="c1"),
        ),
        ApiKey.QUEUE_CANCEL: (
            q.QueueCancelRequest(queue="orders", consumer_tag="c1"),
            q.QueueCancelResponse(),
        ),
        ApiKey.QUEUE_GET: (
            q.QueueGetRequest(
                queue="orders", max_messages=5, wait_ms=100, visibility_timeout_ms=1000
            ),
            q.QueueGetResponse(entries=_ENTRIES),
        ),
        ApiKey.QUEUE_SETTLE: (
            q.QueueSettleRequest(queue="orders", tags=[7, 9], up_to=5, outcome="requeue"),
            q.QueueSettleResponse(error_code=116, error_message="unknown delivery tags: 9"),
        ),
        ApiKey.QUEUE_BROWSE: (
            q.QueueBrowseRequest(queue="orders.dlq", from_offset=3, max_messages=10),
            q.QueueBrowseResponse(entries=[q.DeliveryEntryInfo(0, 3, 1)]),
        ),
        ApiKey.QUEUE_REPLAY: (
            q.QueueReplayRequest(queue="orders.dlq", offsets=[3, 4], to_offset=9),
            q.QueueReplayResponse(messages=2),
        ),
        ApiKey.STREAM_SEND: (
            q.StreamSendRequest(
                items=[
                    q.SendItem("user/42", b"hello"),
                    q.SendItem("user/43", b"\x00\xff", uuid="u-1", ttl_ms=5_000, persistent=True),
                ],
                ring_size=0,
                block_ms=250,
            ),
            q.StreamSendResponse(
                results=[
                    q.SendResult(),
                    q.SendResult(-1, "duplicate", ""),
                    q.SendResult(121, "stream user/44 is full", ""),
                    q.SendResult(0, "", "AQAAAAAAAAAAAAAAAQ"),
                ]
            ),
        ),
        ApiKey.STREAM_RECEIVE: (
            q.StreamReceiveRequest(
                streams=["a", "b"], max_messages=10, wait_ms=30_000, ring_size=5
            ),
            q.StreamReceiveResponse(messages=_STREAM_MESSAGES),
        ),
        ApiKey.STREAM_READ: (
            q.StreamReadRequest(positions={"a": "", "b": "$", "c": "AQAAAAAA"}, wait_ms=100),
            q.StreamReadResponse(messages=_STREAM_MESSAGES, tokens={"a": "AQ", "b": "AR"}),
        ),
        ApiKey.STREAM_LIST: (
            q.StreamListRequest(prefix="user/", after="user/4", limit=2),
            q.StreamListResponse(streams=[_STREAM_INFO], partitions=4, last="user/42"),
        ),
        ApiKey.STREAM_DESCRIBE: (
            q.StreamDescribeRequest(stream="user/42"),
            q.StreamDescribeResponse(
                info=_STREAM_INFO, stats=q.StreamStats(streams=3, persistent_messages=7)
            ),
        ),
        ApiKey.REPLICA_FETCH: (
            q.ReplicaFetchRequest(
                node_id=2,
                max_wait_ms=500,
                partitions=[
                    q.ReplicaFetchPartition("orders", 0, 120, 3, 2, 100),
                    q.ReplicaFetchPartition("orders", 1, 0, 3),
                ],
            ),
            q.ReplicaFetchResponse(
                partitions=[
                    q.ReplicaFetchResult(
                        topic="orders",
                        partition=0,
                        high_watermark=118,
                        log_start_offset=0,
                        leader_epoch=3,
                        diverging_epoch=2,
                        diverging_end_offset=110,
                    ),
                    q.ReplicaFetchResult(
                        topic="orders", partition=1, error_code=132, error_message="fenced"
                    ),
                ]
            ),
        ),
        ApiKey.ALTER_REPLICATION: (
            q.AlterReplicationRequest(
                topic="orders",
                assignments=[q.PartitionReplicas(partition=0, replicas=[2, 3])],
                min_insync_replicas=2,
                unclean_leader_election=False,
            ),
            q.AlterReplicationResponse(
                partitions=[
                    q.PartitionReplication(
                        partition=0,
                        replicas=[2, 3, 1],
                        isr=[1],
                        leader=1,
                        leader_epoch=4,
                        target=[2, 3],
                    )
                ]
            ),
        ),
        ApiKey.TAKE: (
            q.TakeRequest(topic="msgbus.jobs", group="msgbus", ttl_ms=60_000),
            q.TakeResponse(found=True, offset=7, timestamp_ms=1_700_000_000_000, value=b"hi"),
        ),
        ApiKey.HTTP_PUBLISH: (
            q.HttpPublishRequest(
                topic="orders",
                body=b'{"messages":[{"value":"a"},{"value":"b","partition":1}]}',
                batch=True,
                idempotency_key="order-17",
            ),
            q.HttpPublishResponse(results=[q.PublishedAt(0, 41), q.PublishedAt(1, 7)]),
        ),
        ApiKey.CLUSTER_METRICS: (
            q.ClusterMetricsRequest(local=True),
            q.ClusterMetricsResponse(
                nodes=[
                    q.NodeMetricsBody(
                        node_id=2,
                        messages_in=10,
                        bytes_in=1_000,
                        messages_in_per_s=2.5,
                        partitions_led=3,
                        controller=True,
                        offline_partitions=0,
                        lease_stale=True,
                        lease_stale_periods=1,
                    )
                ],
                missing_nodes=[3],
            ),
        ),
        ApiKey.ENVELOPE: (
            q.EnvelopeRequest(
                request_api_key=int(ApiKey.QUEUE_PURGE),
                request_body=q.encode_body(q.QueuePurgeRequest(name="orders")),
                principal="alice",
                principal_kind="user",
                client_source="10.0.0.7:51234",
                client_interface="http",
                forwarded_by=2,
            ),
            q.EnvelopeResponse(response_body=q.encode_body(q.QueuePurgeResponse(messages=3))),
        ),
    }
)
#: The body of each push-only API (QUEUE_DELIVER).
PUSH_SAMPLES: dict[ApiKey, msgspec.Struct] = {
    ApiKey.QUEUE_DELIVER: q.QueueDeliverBody(queue="orders", consumer_tag="c1", entries=_ENTRIES),
}

#: Every API a client requests (not the push-only ones).
REQUESTED = [key for key in ApiKey if key not in PUSH_SCHEMAS]

#: Every schema, request and response, as (api key, response?, schema) for parametrizing.
SCHEMAS: list[tuple[ApiKey, bool, type[Body]]] = [
    (key, response, schema_for(key, 0, response=response))
    for key in ApiKey
    if key not in PUSH_SCHEMAS
    for response in (False, True)
]

# --- strategies -----------------------------------------------------------------------------------

#: The integers msgpack carries: int64 and uint64.
INTS = st.integers(min_value=-(2**63), max_value=2**64 - 1)


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """A strategy for any value of the type annotation ``tp`` as the schemas use them."""
    if tp is bool:
        return st.booleans()
    if tp is int:
        return INTS
    if tp is bool:
        return st.booleans()
    if tp is float:  # compared after a round trip: no NaN (never equal to itself)
        return st.floats(allow_nan=False)
    if tp is str:
        return st.text(max_size=12)
    if tp is bytes:
        return st.binary(max_size=12)
    if tp is type(None):
        return st.none()
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(strategy_for(arg) for arg in typing.get_args(tp)))
    if origin is list:
        return st.lists(strategy_for(typing.get_args(tp)[0]), max_size=3)
    if origin is dict:
        key, value = typing.get_args(tp)
        return st.dictionaries(strategy_for(key), strategy_for(value), max_size=3)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return structs(tp)
    raise TypeError(f"no strategy for {tp!r}")


def structs(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    """Instances of ``cls`` with every field drawn (defaults included now and then)."""
    fields = {f.name: strategy_for(f.type) for f in msgspec.structs.fields(cls)}
    return st.builds(cls, **fields)


# --- moving bytes between connections ---------------------------------------------------------

Mode = Literal["whole", "byte_by_byte"]
MODES: tuple[Mode, ...] = ("whole", "byte_by_byte")


def join(buffers: Iterable[Buffer]) -> bytes:
    return b"".join(bytes(b) for b in buffers)


def chunks(data: bytes, mode: Mode) -> Iterator[bytes]:
    if mode == "whole":
        yield data
    else:
        for i in range(len(data)):
            yield data[i : i + 1]


def drain(conn: Connection) -> tuple[list[Any], Any]:
    """Every event ``conn`` has ready, and what stopped the loop: NEED_DATA, PAUSED, or the
    ConnectionClosed event (which repeats for ever)."""
    events: list[Any] = []
    while True:
        event = conn.next_event()
        if event is NEED_DATA or event is PAUSED:
            return events, event
        events.append(event)
        if isinstance(event, ConnectionClosed):
            return events, event


def deliver(buffers: Sequence[Buffer], conn: Connection, mode: Mode) -> list[Any]:
    """Hand ``buffers`` to ``conn`` (in one piece or a byte at a time, taking the events as
    they come) and return every event it produced."""
    events: list[Any] = []
    for chunk in chunks(join(buffers), mode):
        conn.receive_data(chunk)
        events += drain(conn)[0]
    return events
