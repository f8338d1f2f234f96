"""The message bodies of every API, as schemas, and the one codec that encodes them (pure).

Bodies are msgpack maps (field names as keys, so a field can be added in a later version
without breaking older peers; unknown fields are ignored), encoded and validated by msgspec.
Record batches never go through this codec: they travel raw in the frame's data section, and
a body says how many bytes of it belong to which partition.

Each API has a request and a response schema. A response frame with the error flag carries an
:class:`ErrorBody` instead (an unknown API, an unsupported version, a body that failed
validation). Per-partition results carry their own ``error_code``/``error_message``.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar, Protocol

import msgspec

from tidewire.errors import InvalidRequestError, UnknownApiError, UnsupportedVersionError
from tidewire.protocol.streams import (
    SendItem,
    SendResult,
    StreamInfo,
    StreamMessage,
    StreamStats,
)

__all__ = [
    "ACKS_DURABLE",
    "ACKS_LEADER",
    "ACKS_NONE",
    "EARLIEST",
    "LATEST",
    "MAX_SEND_ITEMS",
    "OUTCOME_ACK",
    "OUTCOME_DEAD_LETTER",
    "OUTCOME_REQUEUE",
    "PUSH_SCHEMAS",
    "RESET_EARLIEST",
    "RESET_LATEST",
    "RESET_OFFSET",
    "RESET_TIMESTAMP",
    "RING_SIZE_DEFAULT",
    "AclEntry",
    "AlterAclsRequest",
    "AlterAclsResponse",
    "AlterPrincipalRequest",
    "AlterPrincipalResponse",
    "AlterQuotasRequest",
    "AlterQuotasResponse",
    "AlterReplicationRequest",
    "AlterReplicationResponse",
    "AlterTopicRequest",
    "AlterTopicResponse",
    "ApiKey",
    "ApiKeyInfo",
    "ApiVersionRange",
    "ApiVersionsRequest",
    "ApiVersionsResponse",
    "AuditEventBody",
    "BindingInfo",
    "Body",
    "ClusterMetricsRequest",
    "ClusterMetricsResponse",
    "CommitPartition",
    "CommittedOffset",
    "CreateApiKeyRequest",
    "CreateApiKeyResponse",
    "CreatePrincipalRequest",
    "CreatePrincipalResponse",
    "CreateTopicRequest",
    "CreateTopicResponse",
    "CreditRequest",
    "CreditResponse",
    "DamageInfo",
    "DeleteGroupRequest",
    "DeleteGroupResponse",
    "DeletePrincipalRequest",
    "DeletePrincipalResponse",
    "DeleteTopicRequest",
    "DeleteTopicResponse",
    "DeliveryEntryInfo",
    "DescribeAclsRequest",
    "DescribeAclsResponse",
    "DescribeAuditRequest",
    "DescribeAuditResponse",
    "DescribeGroupRequest",
    "DescribeGroupResponse",
    "DescribePrincipalsRequest",
    "DescribePrincipalsResponse",
    "DescribeQuotasRequest",
    "DescribeQuotasResponse",
    "DescribeTopicRequest",
    "DescribeTopicResponse",
    "EnvelopeRequest",
    "EnvelopeResponse",
    "ErrorBody",
    "ExchangeDeclareRequest",
    "ExchangeDeclareResponse",
    "ExchangeDeleteRequest",
    "ExchangeDeleteResponse",
    "ExchangeInfo",
    "FetchPartition",
    "FetchPartitionResult",
    "FetchRequest",
    "FetchResponse",
    "GroupMember",
    "GroupPartition",
    "GroupPartitionLag",
    "GroupSummary",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "HttpPublishRequest",
    "HttpPublishResponse",
    "InitProducerIdRequest",
    "InitProducerIdResponse",
    "JoinGroupRequest",
    "JoinGroupResponse",
    "LeaveGroupRequest",
    "LeaveGroupResponse",
    "ListExchangesRequest",
    "ListExchangesResponse",
    "ListGroupsRequest",
    "ListGroupsResponse",
    "ListOffsetsPartition",
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "ListOffsetsResult",
    "ListQueuesRequest",
    "ListQueuesResponse",
    "ListTopicsRequest",
    "ListTopicsResponse",
    "MetadataRequest",
    "MetadataResponse",
    "NodeAddress",
    "NodeMetricsBody",
    "OffsetCommitRequest",
    "OffsetCommitResponse",
    "OffsetFetchRequest",
    "OffsetFetchResponse",
    "PartitionInfo",
    "PartitionReplicas",
    "PartitionReplication",
    "PartitionResult",
    "PingRequest",
    "PingResponse",
    "PrincipalInfo",
    "ProducePartition",
    "ProducePartitionResult",
    "ProduceRequest",
    "ProduceResponse",
    "ProducerPartitionState",
    "ProducerStateRequest",
    "ProducerStateResponse",
    "PublishedAt",
    "PushBody",
    "QueueBindRequest",
    "QueueBindResponse",
    "QueueBrowseRequest",
    "QueueBrowseResponse",
    "QueueCancelRequest",
    "QueueCancelResponse",
    "QueueConsumeRequest",
    "QueueConsumeResponse",
    "QueueCountersInfo",
    "QueueDeclareRequest",
    "QueueDeclareResponse",
    "QueueDeleteRequest",
    "QueueDeleteResponse",
    "QueueDeliverBody",
    "QueueGetRequest",
    "QueueGetResponse",
    "QueueInfo",
    "QueuePublishRequest",
    "QueuePublishResponse",
    "QueuePurgeRequest",
    "QueuePurgeResponse",
    "QueueReplayRequest",
    "QueueReplayResponse",
    "QueueSettleRequest",
    "QueueSettleResponse",
    "QueueUnbindRequest",
    "QueueUnbindResponse",
    "QuotaEntry",
    "ReleaseWritersRequest",
    "ReleaseWritersResponse",
    "RepairResult",
    "RepairTopicRequest",
    "RepairTopicResponse",
    "ReplicaFetchPartition",
    "ReplicaFetchRequest",
    "ReplicaFetchResponse",
    "ReplicaFetchResult",
    "ResetOffsetResult",
    "ResetOffsetsRequest",
    "ResetOffsetsResponse",
    "RevokeApiKeyRequest",
    "RevokeApiKeyResponse",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "SendItem",
    "SendResult",
    "StorageProblem",
    "StreamDescribeRequest",
    "StreamDescribeResponse",
    "StreamInfo",
    "StreamListRequest",
    "StreamListResponse",
    "StreamMessage",
    "StreamReadRequest",
    "StreamReadResponse",
    "StreamReceiveRequest",
    "StreamReceiveResponse",
    "StreamSendRequest",
    "StreamSendResponse",
    "StreamStats",
    "SubscribePartition",
    "SubscribeRequest",
    "SubscribeResponse",
    "TakeRequest",
    "TakeResponse",
    "TopicConfig",
    "TopicDescription",
    "TopicOffset",
    "UnsubscribeRequest",
    "UnsubscribeResponse",
    "WhoAmIRequest",
    "WhoAmIResponse",
    "decode_body",
    "encode_body",
    "schema_for",
    "supported_versions",
]

#: ``acks`` of a produce request: no response at all.
ACKS_NONE = 0
#: ``acks``: answered once the batch is written to the log (not necessarily fsynced).
ACKS_LEADER = 1
#: ``acks``: answered once the batch is durable under the topic's fsync policy.
ACKS_DURABLE = -1
#: ``timestamp`` of a list-offsets request: the log end offset.
LATEST = -1
#: ``timestamp`` of a list-offsets request: the log start offset.
EARLIEST = -2


class _Damage(Protocol):
    """What ``DamageInfo.of`` reads of a damaged range the storage found (the storage's
    ``Damage``, described here so the protocol imports nothing of the storage)."""

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def path(self) -> str: ...

    @property
    def position(self) -> int: ...

    @property
    def reason(self) -> str: ...

    @property
    def quarantined(self) -> str | None: ...

    @property
    def size(self) -> int: ...


class ApiKey(enum.IntEnum):
    """API keys of the binary protocol."""

    API_VERSIONS = 0
    METADATA = 1
    CREATE_TOPIC = 2
    DELETE_TOPIC = 3
    LIST_TOPICS = 4
    DESCRIBE_TOPIC = 5
    ALTER_TOPIC = 6
    PRODUCE = 7
    FETCH = 8
    LIST_OFFSETS = 9
    INIT_PRODUCER_ID = 10
    PING = 11
    JOIN_GROUP = 12
    HEARTBEAT = 13
    LEAVE_GROUP = 14
    OFFSET_COMMIT = 15
    OFFSET_FETCH = 16
    LIST_GROUPS = 17
    DESCRIBE_GROUP = 18
    DELETE_GROUP = 19
    RESET_OFFSETS = 20
    SUBSCRIBE = 21
    CREDIT = 22
    UNSUBSCRIBE = 23
    PRODUCER_STATE = 24
    RELEASE_WRITERS = 25
    REPAIR_TOPIC = 26
    SASL_HANDSHAKE = 27
    SASL_AUTHENTICATE = 28
    WHOAMI = 29
    CREATE_PRINCIPAL = 30
    DELETE_PRINCIPAL = 31
    DESCRIBE_PRINCIPALS = 32
    ALTER_PRINCIPAL = 33
    CREATE_API_KEY = 34
    REVOKE_API_KEY = 35
    ALTER_ACLS = 36
    DESCRIBE_ACLS = 37
    ALTER_QUOTAS = 39
    DESCRIBE_QUOTAS = 40
    DESCRIBE_AUDIT = 38
    EXCHANGE_DECLARE = 41
    EXCHANGE_DELETE = 42
    QUEUE_DECLARE = 43
    QUEUE_DELETE = 44
    QUEUE_PURGE = 45
    QUEUE_BIND = 46
    QUEUE_UNBIND = 47
    LIST_QUEUES = 48
    LIST_EXCHANGES = 49
    QUEUE_PUBLISH = 50
    QUEUE_CONSUME = 51
    QUEUE_CANCEL = 52
    QUEUE_GET = 53
    QUEUE_SETTLE = 54
    #: Pushed by the server only (a consumer's deliveries): never a request.
    QUEUE_DELIVER = 55
    QUEUE_BROWSE = 56
    QUEUE_REPLAY = 57
    STREAM_SEND = 58
    STREAM_RECEIVE = 59
    STREAM_READ = 60
    STREAM_LIST = 61
    STREAM_DESCRIBE = 62
    REPLICA_FETCH = 63
    ALTER_REPLICATION = 64
    TAKE = 65
    HTTP_PUBLISH = 66
    CLUSTER_METRICS = 67
    ENVELOPE = 68


class Body(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Base of every message body."""

    api_key: ClassVar[ApiKey]


# --- errors and handshake ------------------------------------------------------------------------


class ErrorBody(msgspec.Struct, kw_only=True):
    """The body of a response frame with the error flag: the request as a whole failed."""

    error_code: int
    error_message: str


class ApiVersionsRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.API_VERSIONS
    client_name: str = ""
    client_version: str = ""


class ApiVersionRange(msgspec.Struct, array_like=True):
    api_key: int
    min_version: int
    max_version: int


class ApiVersionsResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.API_VERSIONS
    server_version: str
    apis: list[ApiVersionRange]


class PingRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.PING
    #: Also list what the broker's storage does not serve (costs a look at every partition).
    storage: bool = False


class StorageProblem(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A partition that does not serve everything it holds: ``kind`` ``damaged`` (offsets
    ``start`` .. ``end - 1`` are refused), ``quarantined`` (they are read past as a gap;
    ``file`` holds their bytes) or ``offline`` (the partition could not be opened: every
    request for it is refused; ``reason`` says why)."""

    topic: str
    partition: int
    kind: str
    start: int = -1
    end: int = -1
    size_bytes: int = 0
    file: str = ""
    reason: str = ""


class PingResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.PING
    #: With ``storage``: what the broker's storage does not serve (the first 100); empty
    #: when every partition serves all it holds.
    problems: list[StorageProblem] = msgspec.field(default_factory=list)
    problems_total: int = 0  # how many there are in all


# --- topics ---------------------------------------------------------------------------------------


class TopicConfig(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Topic settings; ``None`` means "the broker's default" (create) or "unchanged" (alter)."""

    retention_ms: int | None = None
    retention_bytes: int | None = None
    segment_bytes: int | None = None
    segment_ms: int | None = None
    fsync: str | None = None
    flush_interval_ms: int | None = None
    max_message_bytes: int | None = None


class DamageInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A damaged range of a partition's log: offsets ``start`` .. ``end - 1``, whose
    ``size_bytes`` bytes at byte ``position`` of the segment ``file`` failed their checks.
    Refused to readers until quarantined (then ``quarantined`` names the file holding the
    bytes and readers pass the range as a gap)."""

    start: int
    end: int
    size_bytes: int
    file: str
    position: int
    reason: str
    quarantined: str = ""

    @classmethod
    def of(cls, d: _Damage) -> DamageInfo:
        """The wire form of a damaged range the storage found."""
        return cls(
            start=d.start,
            end=d.end,
            size_bytes=d.size,
            file=d.path,
            position=d.position,
            reason=d.reason,
            quarantined=d.quarantined or "",
        )


class PartitionInfo(msgspec.Struct, kw_only=True, gc=False):
    # gc=False: numbers and a string only (no cycles possible); a metadata answer holds one per
    # partition, and 10,000 tracked objects would make the collector scan the broker's heap.
    partition: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    error_code: int = 0
    error_message: str = ""
    damage: list[DamageInfo] = msgspec.field(default_factory=list)
    offline: str = ""  # why the partition could not be opened; empty when it serves
    # In a cluster (empty or -1 from a single node, which leads everything it holds): the node
    # leading the partition (-1: none now, the partition is offline), its leader epoch, every
    # replica and the in-sync ones.
    leader: int = -1
    leader_epoch: int = -1
    replicas: list[int] = msgspec.field(default_factory=list)
    isr: list[int] = msgspec.field(default_factory=list)


class RepairTopicRequest(Body, kw_only=True, omit_defaults=True):
    """``action``: ``report`` (list the damaged ranges), ``quarantine`` or ``truncate``
    (every damaged range that is not quarantined, of ``partition`` or of every partition)."""

    api_key = ApiKey.REPAIR_TOPIC
    name: str
    partition: int | None = None
    action: str = "report"


class RepairResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One damaged range and what was done to it (``action``: ``none``, ``quarantined``,
    ``truncated``); a truncation removed ``removed_offsets`` offsets and ``removed_bytes``
    bytes, and the log now ends at ``log_end_offset``."""

    partition: int
    start: int
    end: int
    size_bytes: int
    action: str
    file: str = ""
    reason: str = ""
    removed_offsets: int = 0
    removed_bytes: int = 0
    log_end_offset: int = -1


class RepairTopicResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.REPAIR_TOPIC
    results: list[RepairResult] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class TopicDescription(msgspec.Struct, kw_only=True):
    name: str
    partitions: list[PartitionInfo]
    config: TopicConfig
    error_code: int = 0
    error_message: str = ""
    #: In a cluster (0 on a single node): copies of each partition, the in-sync replicas
    #: acks=all needs, and whether unclean leader election is allowed.
    replication_factor: int = 0
    min_insync_replicas: int = 0
    unclean_leader_election: bool = False


class MetadataRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.METADATA
    topics: list[str] | None = None  # None: every topic
    #: Create each named topic that does not exist, as a first publish would (only where the
    #: broker creates topics on first publish; with the broker's default partition count).
    auto_create: bool = False


class NodeAddress(msgspec.Struct, kw_only=True):
    """A node of a cluster and where clients reach it (its advertised address)."""

    node_id: int
    host: str
    port: int


class MetadataResponse(Body, kw_only=True, omit_defaults=True):
    """``broker_id``/``host``/``port``: the node that answers. In a cluster, ``nodes`` lists
    every live node and ``controller`` the one placing replicas (-1: none now); a single node
    leaves both empty."""

    api_key = ApiKey.METADATA
    broker_id: int
    host: str
    port: int
    topics: list[TopicDescription]
    nodes: list[NodeAddress] = msgspec.field(default_factory=list)
    controller: int = -1


class CreateTopicRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.CREATE_TOPIC
    name: str
    partitions: int | None = None
    config: TopicConfig = msgspec.field(default_factory=TopicConfig)
    #: In a cluster: copies of each partition (None: the node's default, at most the live
    #: nodes). A single node holds one copy and ignores it.
    replication_factor: int | None = None
    #: In a cluster: in-sync replicas an acks=all produce needs (None: the node's
    #: ``--min-insync-replicas``), 1..replication_factor. A single node refuses above 1.
    min_insync_replicas: int | None = None
    #: In a cluster: whether a replica outside the ISR may be elected when no in-sync one is
    #: left (losing what only the lost ones held). A single node refuses True.
    unclean_leader_election: bool | None = None


class CreateTopicResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.CREATE_TOPIC
    error_code: int = 0
    error_message: str = ""


class DeleteTopicRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.DELETE_TOPIC
    name: str


class DeleteTopicResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.DELETE_TOPIC
    error_code: int = 0
    error_message: str = ""


class ListTopicsRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.LIST_TOPICS


class ListTopicsResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.LIST_TOPICS
    topics: list[str]


class DescribeTopicRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.DESCRIBE_TOPIC
    name: str


class DescribeTopicResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.DESCRIBE_TOPIC
    topic: TopicDescription | None = None
    error_code: int = 0
    error_message: str = ""


class AlterTopicRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.ALTER_TOPIC
    name: str
    partitions: int | None = None  # a larger count adds partitions; never fewer
    config: TopicConfig = msgspec.field(default_factory=TopicConfig)


class AlterTopicResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.ALTER_TOPIC
    error_code: int = 0
    error_message: str = ""


# --- produce and fetch ---------------------------------------------------------------------


class ProducePartition(msgspec.Struct, array_like=True):
    """One partition's share of the data section: ``size`` bytes of whole batches, in the
    order the partitions are listed."""

    topic: str
    partition: int
    size: int


class ProduceRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.PRODUCE
    acks: int = ACKS_DURABLE
    timeout_ms: int = 30_000
    partitions: list[ProducePartition]


class ProducePartitionResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    topic: str
    partition: int
    base_offset: int = -1
    log_start_offset: int = -1
    error_code: int = 0
    error_message: str = ""


class ProduceResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.PRODUCE
    results: list[ProducePartitionResult]
    #: How long the broker held this answer back because the principal is over its quota.
    throttle_time_ms: int = 0


class FetchPartition(msgspec.Struct, array_like=True):
    topic: str
    partition: int
    offset: int
    max_bytes: int


class FetchRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.FETCH
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 16 * 1024 * 1024
    partitions: list[FetchPartition]


class FetchPartitionResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One partition's result; its batches are the next ``size`` bytes of the data section."""

    topic: str
    partition: int
    size: int = 0
    high_watermark: int = -1
    log_start_offset: int = -1
    error_code: int = 0
    error_message: str = ""
    #: With PartitionCorruptError (32): the damaged range holding the offset asked for;
    #: reading can go on at ``damage_end``.
    damage_start: int = -1
    damage_end: int = -1


class FetchResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.FETCH
    partitions: list[FetchPartitionResult]
    #: How long the broker held this answer back because the principal is over its quota.
    throttle_time_ms: int = 0


class ListOffsetsPartition(msgspec.Struct, array_like=True):
    """``timestamp``: ``LATEST`` (-1), ``EARLIEST`` (-2), or ms since the epoch (the first
    offset whose record timestamp is at or after it)."""

    topic: str
    partition: int
    timestamp: int


class ListOffsetsRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.LIST_OFFSETS
    partitions: list[ListOffsetsPartition]


class ListOffsetsResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    topic: str
    partition: int
    offset: int = -1
    error_code: int = 0
    error_message: str = ""


class ListOffsetsResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.LIST_OFFSETS
    results: list[ListOffsetsResult]


class InitProducerIdRequest(Body, kw_only=True, omit_defaults=True):
    """``producer_id``/``producer_epoch`` of a producer restarting to bump its epoch, else -1;
    or a ``writer_id``: the deterministic writer of that name (docs/protocol.md)."""

    api_key = ApiKey.INIT_PRODUCER_ID
    producer_id: int = -1
    producer_epoch: int = -1
    writer_id: str = ""


class InitProducerIdResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.INIT_PRODUCER_ID
    producer_id: int = -1
    producer_epoch: int = -1
    error_code: int = 0
    error_message: str = ""


class ProducerStateRequest(Body, kw_only=True, omit_defaults=True):
    """What ``producer_id`` stored last in each of ``partitions`` (``[topic, partition]``)."""

    api_key = ApiKey.PRODUCER_STATE
    producer_id: int
    producer_epoch: int = -1  # the asking instance's epoch: an older one is fenced
    partitions: list[GroupPartition]


class ProducerPartitionState(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One partition's answer: the producer's epoch there and the sequence of the last record
    it stored (-1 and -1: the partition holds nothing of it)."""

    topic: str
    partition: int
    producer_epoch: int = -1
    last_sequence: int = -1
    error_code: int = 0
    error_message: str = ""


class ProducerStateResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.PRODUCER_STATE
    results: list[ProducerPartitionState] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class ReleaseWritersRequest(Body, kw_only=True, omit_defaults=True):
    """Forget the state of these writers: their job committed."""

    api_key = ApiKey.RELEASE_WRITERS
    writer_ids: list[str]


class ReleaseWritersResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.RELEASE_WRITERS
    released: int = 0  # partitions that held state of one of them
    error_code: int = 0
    error_message: str = ""


# --- consumer groups -----------------------------------------------------------------------

#: ``to`` of a reset-offsets request: the log start offset.
RESET_EARLIEST = "earliest"
#: ``to``: the end (high watermark).
RESET_LATEST = "latest"
#: ``to``: ``value`` as an offset, clamped to the log's range.
RESET_OFFSET = "offset"
#: ``to``: the first offset whose timestamp is at or after ``value`` ms (the end if none).
RESET_TIMESTAMP = "timestamp"


class GroupPartition(msgspec.Struct, array_like=True):
    """A partition of a topic: ``[topic, partition]``."""

    topic: str
    partition: int


class JoinGroupRequest(Body, kw_only=True, omit_defaults=True):
    """Join a group (``member_id`` empty: as a new member; a static member restarting sends
    its ``group_instance_id`` and no member id). Answered when the rebalance it starts ends:
    within the group's rebalance timeout."""

    api_key = ApiKey.JOIN_GROUP
    group_id: str
    member_id: str = ""
    group_instance_id: str = ""
    client_id: str = ""
    topics: list[str] = msgspec.field(default_factory=list)
    pattern: str = ""  # a regular expression the whole topic name must match
    strategy: str = "sticky"  # "range", "roundrobin" or "sticky"
    session_timeout_ms: int = 10_000
    rebalance_timeout_ms: int = 30_000


class JoinGroupResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.JOIN_GROUP
    member_id: str = ""
    generation: int = -1
    strategy: str = ""
    members: int = 0
    assignment: list[GroupPartition] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class HeartbeatRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.HEARTBEAT
    group_id: str
    member_id: str
    generation: int


class HeartbeatResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.HEARTBEAT
    error_code: int = 0
    error_message: str = ""


class LeaveGroupRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.LEAVE_GROUP
    group_id: str
    member_id: str


class LeaveGroupResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.LEAVE_GROUP
    error_code: int = 0
    error_message: str = ""


class CommitPartition(msgspec.Struct, array_like=True):
    """``[topic, partition, offset, metadata]``: ``offset`` is the next offset to read."""

    topic: str
    partition: int
    offset: int
    metadata: str = ""


class OffsetCommitRequest(Body, kw_only=True, omit_defaults=True):
    """A member commits with its ``member_id`` and ``generation``; ``member_id`` empty and
    ``generation`` -1 commit from outside a group that has no members."""

    api_key = ApiKey.OFFSET_COMMIT
    group_id: str
    member_id: str = ""
    generation: int = -1
    partitions: list[CommitPartition]


class PartitionResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    topic: str
    partition: int
    error_code: int = 0
    error_message: str = ""


class OffsetCommitResponse(Body, kw_only=True, omit_defaults=True):
    """All partitions of a commit succeed or fail together: every result carries the same
    error."""

    api_key = ApiKey.OFFSET_COMMIT
    results: list[PartitionResult]


class OffsetFetchRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.OFFSET_FETCH
    group_id: str
    partitions: list[GroupPartition] | None = None  # None: every committed partition


class CommittedOffset(msgspec.Struct, kw_only=True, omit_defaults=True):
    topic: str
    partition: int
    offset: int = -1  # -1: nothing committed
    metadata: str = ""


class OffsetFetchResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.OFFSET_FETCH
    offsets: list[CommittedOffset]


class ListGroupsRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.LIST_GROUPS


class GroupSummary(msgspec.Struct, kw_only=True):
    group_id: str
    state: str
    members: int


class ListGroupsResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.LIST_GROUPS
    groups: list[GroupSummary]


class DescribeGroupRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.DESCRIBE_GROUP
    group_id: str


class GroupMember(msgspec.Struct, kw_only=True, omit_defaults=True):
    member_id: str
    group_instance_id: str = ""
    client_id: str = ""
    topics: list[str] = msgspec.field(default_factory=list)
    pattern: str = ""
    assignment: list[GroupPartition] = msgspec.field(default_factory=list)


class GroupPartitionLag(msgspec.Struct, kw_only=True, omit_defaults=True):
    topic: str
    partition: int
    committed: int = -1  # -1: nothing committed
    end_offset: int = -1
    lag: int = -1  # end_offset - committed; -1 when nothing is committed
    metadata: str = ""


class DescribeGroupResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.DESCRIBE_GROUP
    group_id: str = ""
    state: str = ""
    generation: int = 0
    strategy: str = ""
    members: list[GroupMember] = msgspec.field(default_factory=list)
    offsets: list[GroupPartitionLag] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class DeleteGroupRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.DELETE_GROUP
    group_id: str


class DeleteGroupResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.DELETE_GROUP
    error_code: int = 0
    error_message: str = ""


class ResetOffsetsRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.RESET_OFFSETS
    group_id: str
    topic: str
    partitions: list[int] | None = None  # None: every partition of the topic
    to: str  # RESET_EARLIEST, RESET_LATEST, RESET_OFFSET or RESET_TIMESTAMP
    value: int = 0  # the offset or the timestamp (ms)
    dry_run: bool = False


class ResetOffsetResult(msgspec.Struct, kw_only=True):
    topic: str
    partition: int
    previous: int  # -1: nothing was committed
    offset: int


class ResetOffsetsResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.RESET_OFFSETS
    results: list[ResetOffsetResult] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


# --- the audit log -----------------------------------------------------------------------------


class DescribeAuditRequest(Body, kw_only=True, omit_defaults=True):
    """The newest ``limit`` audit events that match every filter given, oldest first."""

    api_key = ApiKey.DESCRIBE_AUDIT
    since_ms: int | None = None  # only events at or after this time (ms since the epoch)
    until_ms: int | None = None  # only events before this time
    principal: str | None = None  # only this principal's ("": anonymous ones)
    action: str | None = None  # only this action (CREATE_TOPIC, authenticate, ...)
    outcome: str | None = None  # only this outcome: allowed, denied, failed, ok
    limit: int = 1000  # 1..10,000
    #: Between the nodes of a cluster: only the audit logs of these nodes, as the answering
    #: node's replicas hold them (never asked further). None: the whole audit log.
    nodes: list[int] | None = None


class AuditEventBody(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One audit event (docs/security.md, "Audit log")."""

    time_ms: int
    principal: str | None = None  # None: anonymous, or not known
    source: str = ""  # the client's host:port
    interface: str = ""  # binary, http, websocket, sse, msgbus, ipubsub, kafka, cli
    action: str = ""
    resource: str = ""  # topic:orders, group:g1, cluster, principal:alice; "": none
    outcome: str = ""  # allowed, denied, failed, ok
    reason: str = ""
    detail: dict[str, str] = msgspec.field(default_factory=dict)
    node_id: int | None = None  # in a cluster: the node that recorded it


class DescribeAuditResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.DESCRIBE_AUDIT
    events: list[AuditEventBody] = msgspec.field(default_factory=list)
    #: In a cluster: the nodes whose audit logs no node answered for in time (their events
    #: are not in ``events``: a partial answer). Empty: every node's.
    missing_nodes: list[int] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


# --- push delivery -------------------------------------------------------------------------


class SubscribePartition(msgspec.Struct, array_like=True):
    """``[topic, partition, offset]``: push this partition's batches from ``offset`` (the
    batch holding it is sent whole; records below it are the client's to skip)."""

    topic: str
    partition: int
    offset: int


class SubscribeRequest(Body, kw_only=True, omit_defaults=True):
    """Open a push subscription on this connection. The server sends PUSH frames (correlation
    id = the subscription id) while the subscription has credit; see CREDIT."""

    api_key = ApiKey.SUBSCRIBE
    subscription_id: int = -1  # -1: the server chooses; else 0..2**31-1, unique per connection
    partitions: list[SubscribePartition]
    credit_bytes: int  # the first grant, and the window the oversized-batch rule compares to
    best_effort: bool = False  # skip to the end, counting the drop, when lagging too far
    max_lag_bytes: int = 64 * 1024 * 1024  # best effort: how far behind the end is too far


class SubscribeResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.SUBSCRIBE
    subscription_id: int = -1
    results: list[PartitionResult] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""
    #: The server sends a push with ``credit_wanted`` when a batch waits for credit, so the
    #: client may hold small grants back (an earlier server never does: absent, False).
    asks_for_credit: bool = False


class CreditRequest(Body, kw_only=True, omit_defaults=True):
    """Grant ``credit_bytes`` more bytes (of push data sections) to a subscription."""

    api_key = ApiKey.CREDIT
    subscription_id: int
    credit_bytes: int


class CreditResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.CREDIT
    error_code: int = 0
    error_message: str = ""


class UnsubscribeRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.UNSUBSCRIBE
    subscription_id: int


class UnsubscribeResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.UNSUBSCRIBE
    error_code: int = 0
    error_message: str = ""


class PushBody(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The body of a PUSH frame (``api_key`` SUBSCRIBE): whole batches of one partition in
    the data section, or an error that ends the subscription's delivery of that partition."""

    topic: str
    partition: int
    offset: int  # the subscription's position before these batches (records below: skip)
    next_offset: int  # the position after them
    high_watermark: int = -1
    dropped: int = 0  # best effort: records skipped on this partition so far (cumulative)
    error_code: int = 0
    error_message: str = ""
    #: With PartitionCorruptError (32): the damaged range that ended delivery (as FETCH's).
    damage_start: int = -1
    damage_end: int = -1
    #: No data: a batch larger than the credit left waits until every byte sent before is
    #: given back (the oversized-batch rule), so the client should give back what it took.
    credit_wanted: bool = False


# --- authentication -----------------------------------------------------------------------------


class SaslHandshakeRequest(Body, kw_only=True, omit_defaults=True):
    """Choose the SASL mechanism of the authentication that follows (right after
    API_VERSIONS): ``SCRAM-SHA-256``, ``SCRAM-SHA-512`` or ``PLAIN``."""

    api_key = ApiKey.SASL_HANDSHAKE
    mechanism: str


class SaslHandshakeResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.SASL_HANDSHAKE
    #: The mechanisms this connection may use (PLAIN only over TLS, unless allowed).
    mechanisms: list[str] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class SaslAuthenticateRequest(Body, kw_only=True, omit_defaults=True):
    """One SASL message of the chosen mechanism, client to server (SCRAM: client-first,
    then client-final; PLAIN: ``\0<key id>\0<API key>`` or ``\0\0<API key>``)."""

    api_key = ApiKey.SASL_AUTHENTICATE
    auth_bytes: bytes


class SaslAuthenticateResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.SASL_AUTHENTICATE
    auth_bytes: bytes = b""
    #: Set once the exchange succeeded: the principal the connection acts as from now on.
    principal: str = ""
    complete: bool = False
    error_code: int = 0
    error_message: str = ""


class WhoAmIRequest(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.WHOAMI


class WhoAmIResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.WHOAMI
    principal: str = ""  # "": anonymous (authentication off)
    kind: str = ""
    roles: list[str] = msgspec.field(default_factory=list)
    mechanism: str = ""  # SCRAM-SHA-256, SCRAM-SHA-512, PLAIN, certificate, or ""
    tls: bool = False
    authentication: bool = False  # whether the broker requires it
    superuser: bool = False


# --- security administration: principals, API keys, ACLs, quotas -----------------------------


class ApiKeyInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An API key as it is listed: never its secret nor its hash."""

    id: str
    principal: str
    state: str  # "active", "expired" or "revoked"
    created_ms: int
    expires_ms: int = 0  # 0: never
    revoked_ms: int = 0  # 0: not revoked
    description: str = ""


class PrincipalInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A principal with its API keys."""

    name: str
    kind: str = "user"  # "user" or "service"
    roles: list[str] = msgspec.field(default_factory=list)
    created_ms: int = 0
    description: str = ""
    keys: list[ApiKeyInfo] = msgspec.field(default_factory=list)


class CreatePrincipalRequest(Body, kw_only=True, omit_defaults=True):
    """Create a user or a service account (``kind`` ``"service"``) with roles."""

    api_key = ApiKey.CREATE_PRINCIPAL
    name: str
    kind: str = "user"
    roles: list[str] = msgspec.field(default_factory=list)
    description: str = ""


class CreatePrincipalResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.CREATE_PRINCIPAL
    principal: PrincipalInfo | None = None
    error_code: int = 0
    error_message: str = ""


class DeletePrincipalRequest(Body, kw_only=True, omit_defaults=True):
    """Delete a principal with its keys, ACLs and quota."""

    api_key = ApiKey.DELETE_PRINCIPAL
    name: str


class DeletePrincipalResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.DELETE_PRINCIPAL
    #: What went with it.
    keys_deleted: int = 0
    acls_deleted: int = 0
    error_code: int = 0
    error_message: str = ""


class DescribePrincipalsRequest(Body, kw_only=True, omit_defaults=True):
    """The principals named (``None``: every one), each with its keys."""

    api_key = ApiKey.DESCRIBE_PRINCIPALS
    names: list[str] | None = None


class DescribePrincipalsResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.DESCRIBE_PRINCIPALS
    principals: list[PrincipalInfo] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class AlterPrincipalRequest(Body, kw_only=True, omit_defaults=True):
    """Replace a principal's roles and/or description (``None``: leave as is)."""

    api_key = ApiKey.ALTER_PRINCIPAL
    name: str
    roles: list[str] | None = None
    description: str | None = None


class AlterPrincipalResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.ALTER_PRINCIPAL
    principal: PrincipalInfo | None = None
    error_code: int = 0
    error_message: str = ""


class CreateApiKeyRequest(Body, kw_only=True, omit_defaults=True):
    """A new API key for ``principal``; ``expires_ms`` is a time in ms since the epoch
    (0: never)."""

    api_key = ApiKey.CREATE_API_KEY
    principal: str
    expires_ms: int = 0
    description: str = ""


class CreateApiKeyResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.CREATE_API_KEY
    key: ApiKeyInfo | None = None
    #: The whole key (``twk_<id>_<secret>``): in this answer only, never again.
    secret_key: str = ""
    error_code: int = 0
    error_message: str = ""


class RevokeApiKeyRequest(Body, kw_only=True, omit_defaults=True):
    """Revoke a key by id. With ``principal``, the key must be that principal's: a
    principal revokes its own keys so, without the right to manage others'."""

    api_key = ApiKey.REVOKE_API_KEY
    key_id: str
    principal: str = ""


class RevokeApiKeyResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.REVOKE_API_KEY
    key: ApiKeyInfo | None = None
    error_code: int = 0
    error_message: str = ""


class AclEntry(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One ACL entry (see :mod:`tidewire.security.model`): ``principal`` is a name,
    ``role:NAME`` or ``*``; ``resource_type`` topic, group, cluster, queue, exchange or
    stream; ``pattern_type`` literal or prefix; ``operation`` read, write, create, delete,
    describe, alter, admin or all; ``effect`` allow or deny."""

    principal: str
    resource_type: str
    pattern: str
    pattern_type: str = "literal"
    operation: str
    effect: str = "allow"


class AlterAclsRequest(Body, kw_only=True, omit_defaults=True):
    """Add and remove ACL entries (all are checked before any is changed)."""

    api_key = ApiKey.ALTER_ACLS
    add: list[AclEntry] = msgspec.field(default_factory=list)
    remove: list[AclEntry] = msgspec.field(default_factory=list)


class AlterAclsResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.ALTER_ACLS
    #: The entries that were added (not present before) and removed (present before).
    added: list[AclEntry] = msgspec.field(default_factory=list)
    removed: list[AclEntry] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class DescribeAclsRequest(Body, kw_only=True, omit_defaults=True):
    """The ACL entries that pass every filter given ("": any)."""

    api_key = ApiKey.DESCRIBE_ACLS
    principal: str = ""
    resource_type: str = ""
    #: The entry's pattern, exactly.
    pattern: str = ""
    pattern_type: str = ""
    #: A resource name: entries whose pattern covers it (literal, prefix or ``*``).
    matching: str = ""


class DescribeAclsResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.DESCRIBE_ACLS
    acls: list[AclEntry] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class QuotaEntry(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A principal's quotas: bytes or requests per second; 0 none, -1 the broker's
    default. In a set request, ``None`` leaves a value as it is."""

    principal: str
    produce_bytes_per_s: int | None = None
    fetch_bytes_per_s: int | None = None
    requests_per_s: int | None = None


class AlterQuotasRequest(Body, kw_only=True, omit_defaults=True):
    """Set some principals' quotas, and clear others' (back to the broker's defaults)."""

    api_key = ApiKey.ALTER_QUOTAS
    set_quotas: list[QuotaEntry] = msgspec.field(default_factory=list)
    clear_quotas: list[str] = msgspec.field(default_factory=list)


class AlterQuotasResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.ALTER_QUOTAS
    #: The quotas now in place of the principals set.
    quotas: list[QuotaEntry] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class DescribeQuotasRequest(Body, kw_only=True, omit_defaults=True):
    """The quotas of the principals named (``None``: every one with its own)."""

    api_key = ApiKey.DESCRIBE_QUOTAS
    principals: list[str] | None = None


class DescribeQuotasResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.DESCRIBE_QUOTAS
    quotas: list[QuotaEntry] = msgspec.field(default_factory=list)
    #: The broker's defaults (principal ``*``), which -1 stands for.
    defaults: QuotaEntry | None = None
    error_code: int = 0
    error_message: str = ""


# --- queues and exchanges ------------------------------------------------------------------
#
# AMQP-style queues (docs/protocol.md, "Queues and exchanges"). A message is one record of a
# record batch: key = routing key, value = body, headers = message headers. Messages travel
# raw in the data section (QUEUE_PUBLISH requests; QUEUE_GET, QUEUE_BROWSE responses and
# QUEUE_DELIVER pushes) as whole batches; ``entries`` name the records that belong to the
# answer by offset, and every other record of those batches is to be skipped.


class ExchangeDeclareRequest(Body, kw_only=True, omit_defaults=True):
    """Declare an exchange (``type`` direct, fanout, topic or headers). Declaring one that
    exists with equal settings does nothing; different ones: PreconditionFailedError.
    ``passive``: only check that it exists (UnknownExchangeError)."""

    api_key = ApiKey.EXCHANGE_DECLARE
    name: str
    type: str = "direct"
    durable: bool = True
    alternate_exchange: str = ""  # where messages that match no binding go ("": nowhere)
    passive: bool = False


class ExchangeDeclareResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.EXCHANGE_DECLARE
    error_code: int = 0
    error_message: str = ""


class ExchangeDeleteRequest(Body, kw_only=True, omit_defaults=True):
    """Delete an exchange and its bindings (``if_unused``: only when it has none)."""

    api_key = ApiKey.EXCHANGE_DELETE
    name: str
    if_unused: bool = False


class ExchangeDeleteResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.EXCHANGE_DELETE
    error_code: int = 0
    error_message: str = ""


class QueueCountersInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Messages per fate since the broker started or the queue was made."""

    published: int = 0
    delivered: int = 0
    acked: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    expired: int = 0
    dropped: int = 0
    rejected_publishes: int = 0


class QueueInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A queue: its settings (0: no limit), its messages now and its counters.

    ``ready``: deliverable now; ``unacked``: delivered and not settled; ``delayed``: not due
    yet; ``bytes``: stored bytes of all three; ``consumers``: consumers attached."""

    name: str
    durable: bool = True
    exclusive: bool = False
    auto_delete: bool = False
    max_deliveries: int = 0
    message_ttl_ms: int = 0
    max_length: int = 0
    max_length_bytes: int = 0
    overflow: str = "reject-publish"
    dead_letter_exchange: str | None = None  # None: no dead-lettering; "": the default one
    dead_letter_routing_key: str = ""
    visibility_timeout_ms: int = 0
    ready: int = 0
    unacked: int = 0
    delayed: int = 0
    bytes: int = 0
    consumers: int = 0
    counters: QueueCountersInfo = msgspec.field(default_factory=QueueCountersInfo)


class QueueDeclareRequest(Body, kw_only=True, omit_defaults=True):
    """Declare a queue (see :class:`QueueInfo` for the settings). Declaring one that exists
    with equal settings returns it; different ones: PreconditionFailedError. ``passive``:
    only describe it (UnknownQueueError when it does not exist)."""

    api_key = ApiKey.QUEUE_DECLARE
    name: str
    durable: bool = True
    exclusive: bool = False
    auto_delete: bool = False
    max_deliveries: int = 0
    message_ttl_ms: int = 0
    max_length: int = 0
    max_length_bytes: int = 0
    overflow: str = "reject-publish"  # or "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str = ""
    visibility_timeout_ms: int = 0
    passive: bool = False


class QueueDeclareResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.QUEUE_DECLARE
    queue: QueueInfo | None = None
    error_code: int = 0
    error_message: str = ""


class QueueDeleteRequest(Body, kw_only=True, omit_defaults=True):
    """Delete a queue with its messages (``if_empty``: only without messages;
    ``if_unused``: only without consumers: else PreconditionFailedError).

    ``auto_delete_by`` (a cluster's own request, ``-1``: not one): the id of the node that
    owns durable ``auto_delete`` queue ``name`` and asks the leader of the queue
    definitions to delete it, its last consumer gone. It needs ``cluster_action`` on the
    cluster instead of ``delete`` on the queue, and deletes only such a queue, unused,
    while that node owns it (``if_unused`` implied)."""

    api_key = ApiKey.QUEUE_DELETE
    name: str
    if_empty: bool = False
    if_unused: bool = False
    auto_delete_by: int = -1


class QueueDeleteResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.QUEUE_DELETE
    messages: int = 0  # messages dropped with it
    error_code: int = 0
    error_message: str = ""


class QueuePurgeRequest(Body, kw_only=True, omit_defaults=True):
    """Remove a queue's ready messages (delivered ones stay with their consumers)."""

    api_key = ApiKey.QUEUE_PURGE
    name: str


class QueuePurgeResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.QUEUE_PURGE
    messages: int = 0  # messages removed
    error_code: int = 0
    error_message: str = ""


class QueueBindRequest(Body, kw_only=True, omit_defaults=True):
    """Bind ``exchange`` to a queue or a topic (``destination_kind``). ``key``: the binding
    key (direct: equal to the routing key; topic: a pattern of words with ``*`` and ``#``;
    fanout: ignored); ``arguments`` (headers exchange): ``x-match`` ``all`` or ``any`` and the
    header values to match. Binding twice does nothing."""

    api_key = ApiKey.QUEUE_BIND
    exchange: str
    destination: str
    destination_kind: str = "queue"
    key: str = ""
    arguments: dict[str, str] = msgspec.field(default_factory=dict)


class QueueBindResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.QUEUE_BIND
    error_code: int = 0
    error_message: str = ""


class QueueUnbindRequest(Body, kw_only=True, omit_defaults=True):
    """Remove a binding (one that does not exist: no error)."""

    api_key = ApiKey.QUEUE_UNBIND
    exchange: str
    destination: str
    destination_kind: str = "queue"
    key: str = ""
    arguments: dict[str, str] = msgspec.field(default_factory=dict)


class QueueUnbindResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.QUEUE_UNBIND
    error_code: int = 0
    error_message: str = ""


class ListQueuesRequest(Body, kw_only=True, omit_defaults=True):
    """Every queue the principal may describe."""

    api_key = ApiKey.LIST_QUEUES


class ListQueuesResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.LIST_QUEUES
    queues: list[QueueInfo] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class ExchangeInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An exchange (the default exchange is ``""``)."""

    name: str
    type: str = "direct"
    durable: bool = True
    alternate_exchange: str = ""


class BindingInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A binding from an exchange to a queue or a topic (see :class:`QueueBindRequest`)."""

    exchange: str
    destination: str
    destination_kind: str = "queue"
    key: str = ""
    arguments: dict[str, str] = msgspec.field(default_factory=dict)


class ListExchangesRequest(Body, kw_only=True, omit_defaults=True):
    """Every exchange the principal may describe, and their bindings."""

    api_key = ApiKey.LIST_EXCHANGES


class ListExchangesResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.LIST_EXCHANGES
    exchanges: list[ExchangeInfo] = msgspec.field(default_factory=list)
    bindings: list[BindingInfo] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class QueuePublishRequest(Body, kw_only=True, omit_defaults=True):
    """Publish the records of the batches in the data section (one or more whole batches)
    to ``exchange``; every record shares the routing key, ``headers`` (what a headers
    exchange matches; the records' own headers travel with them), TTL and delay. Answered
    once stored in every queue it routes to (durable queues: fsynced).

    ``mandatory``: refuse (UnroutableError) when no queue or topic takes it, instead of
    dropping it. ``ttl_ms``: the messages expire that long after publishing (0: the queue's
    TTL only). ``deliver_at_ms`` (ms since the epoch) or ``delay_ms`` (from now, by the
    broker's clock): not delivered before then (0: at once; both: the later)."""

    api_key = ApiKey.QUEUE_PUBLISH
    exchange: str
    routing_key: str = ""
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    mandatory: bool = False
    ttl_ms: int = 0
    deliver_at_ms: int = 0
    delay_ms: int = 0


class TopicOffset(msgspec.Struct, array_like=True):
    """``[topic, partition, base_offset]``: where a publish bound to a topic was stored."""

    topic: str
    partition: int
    base_offset: int


class QueuePublishResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.QUEUE_PUBLISH
    queues: list[str] = msgspec.field(default_factory=list)
    topics: list[TopicOffset] = msgspec.field(default_factory=list)
    unroutable: bool = False  # routed nowhere (and dropped: not mandatory)
    error_code: int = 0
    error_message: str = ""


class DeliveryEntryInfo(msgspec.Struct, array_like=True):
    """``[tag, offset, delivery_count]``: one message of a delivery: its delivery tag (to
    settle it with), its offset in the queue (the record's offset in the data section), and
    how many times it has been delivered, this time included (1: the first)."""

    tag: int
    offset: int
    delivery_count: int


class QueueConsumeRequest(Body, kw_only=True, omit_defaults=True):
    """Consume from a queue on this connection: the broker pushes QUEUE_DELIVER frames with
    at most ``prefetch`` messages delivered and not settled at a time. ``consumer_tag``:
    "" lets the broker choose one. The consumer ends with QUEUE_CANCEL or its connection;
    what it has not settled then is delivered again."""

    api_key = ApiKey.QUEUE_CONSUME
    queue: str
    prefetch: int = 100
    consumer_tag: str = ""


class QueueConsumeResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.QUEUE_CONSUME
    consumer_tag: str = ""
    error_code: int = 0
    error_message: str = ""


class QueueCancelRequest(Body, kw_only=True, omit_defaults=True):
    """End a consumer of this connection; its unsettled messages are delivered again."""

    api_key = ApiKey.QUEUE_CANCEL
    queue: str
    consumer_tag: str


class QueueCancelResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.QUEUE_CANCEL
    error_code: int = 0
    error_message: str = ""


class QueueGetRequest(Body, kw_only=True, omit_defaults=True):
    """Take up to ``max_messages`` ready messages, waiting up to ``wait_ms`` for one. They
    are held for this connection until settled, until it closes, or for
    ``visibility_timeout_ms`` (None: the queue's setting)."""

    api_key = ApiKey.QUEUE_GET
    queue: str
    max_messages: int = 1
    wait_ms: int = 0
    visibility_timeout_ms: int | None = None


class QueueGetResponse(Body, kw_only=True, omit_defaults=True):
    """The messages taken (none: the queue had none ready in time); their records are in
    the data section's batches."""

    api_key = ApiKey.QUEUE_GET
    entries: list[DeliveryEntryInfo] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


#: ``outcome`` of a settle request: done with the message.
OUTCOME_ACK = "ack"
#: ``outcome``: deliver it again (nack with requeue).
OUTCOME_REQUEUE = "requeue"
#: ``outcome``: dead-letter it, or drop it without a dead-letter exchange (reject, or nack
#: without requeue).
OUTCOME_DEAD_LETTER = "dead-letter"


class QueueSettleRequest(Body, kw_only=True, omit_defaults=True):
    """Settle deliveries this connection holds: ``tags``, and with ``up_to`` > 0 also every
    tag up to it (the acknowledgement of many at once). Tags not held by this connection are
    named in an UnknownDeliveryTagError; the others are settled anyway."""

    api_key = ApiKey.QUEUE_SETTLE
    queue: str
    tags: list[int] = msgspec.field(default_factory=list)
    up_to: int = 0
    outcome: str = OUTCOME_ACK


class QueueSettleResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.QUEUE_SETTLE
    error_code: int = 0
    error_message: str = ""


class QueueDeliverBody(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The body of a PUSH frame with ``api_key`` QUEUE_DELIVER (correlation id 0): messages
    for the consumer ``consumer_tag`` of ``queue``, their records in the data section."""

    queue: str
    consumer_tag: str
    entries: list[DeliveryEntryInfo] = msgspec.field(default_factory=list)
    #: The consumer has ended without asking (its queue was deleted): no entries, and no
    #: more deliveries for it.
    cancelled: bool = False


class QueueBrowseRequest(Body, kw_only=True, omit_defaults=True):
    """Look at ready messages from ``from_offset`` on without taking them (dead-letter
    queues): the entries' tags are 0."""

    api_key = ApiKey.QUEUE_BROWSE
    queue: str
    from_offset: int = 0
    max_messages: int = 100


class QueueBrowseResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.QUEUE_BROWSE
    entries: list[DeliveryEntryInfo] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class QueueReplayRequest(Body, kw_only=True, omit_defaults=True):
    """Move dead letters back to the queue their newest ``x-death`` entry names: those at
    ``offsets``, or the ready ones in ``[from_offset, to_offset)`` (``to_offset`` -1: to
    the end)."""

    api_key = ApiKey.QUEUE_REPLAY
    queue: str
    offsets: list[int] | None = None
    from_offset: int = 0
    to_offset: int = -1


class QueueReplayResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.QUEUE_REPLAY
    messages: int = 0  # how many moved
    error_code: int = 0
    error_message: str = ""


# --- lightweight streams -------------------------------------------------------------------
# Values travel in the body (msgpack bin inside array_like items), not the data section:
# a stream message is small and has no record of its own. The value types are those of
# tidewire.protocol.streams (tidewire.broker.streams.model names the same classes).

#: The most items one STREAM_SEND carries: clients split larger sends (and so keep each
#: request's decode and the broker's work per request bounded).
MAX_SEND_ITEMS = 10_000
#: ``ring_size`` of a request: the broker's ``stream_ring_size``.
RING_SIZE_DEFAULT = -1


class StreamSendRequest(Body, kw_only=True, omit_defaults=True):
    """Send ``items`` (each to its own stream). ``ring_size``: the ring bound of a stream this
    request creates (-1: the broker's default); ``block_ms``: how long a send to a full ring
    waits for room (0: push the oldest waiting message out); ``tokens``: whether results of
    persistent items carry their resume token."""

    api_key = ApiKey.STREAM_SEND
    items: list[SendItem] = msgspec.field(default_factory=list)
    ring_size: int = RING_SIZE_DEFAULT
    block_ms: int = 0
    #: False: persistent items' results carry no token (smaller and cheaper answers)
    tokens: bool = True


class StreamSendResponse(Body, kw_only=True, omit_defaults=True):
    """One result per item, in order (per-item errors there); ``error_code``: the request
    as a whole failed (no results)."""

    api_key = ApiKey.STREAM_SEND
    results: list[SendResult] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class StreamReceiveRequest(Body, kw_only=True, omit_defaults=True):
    """Take (work-queue mode) up to ``max_messages`` of the oldest waiting messages of
    ``streams``, waiting up to ``wait_ms`` for the first."""

    api_key = ApiKey.STREAM_RECEIVE
    streams: list[str] = msgspec.field(default_factory=list)
    max_messages: int = 1
    wait_ms: int = 0
    ring_size: int = RING_SIZE_DEFAULT


class StreamReceiveResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.STREAM_RECEIVE
    messages: list[StreamMessage] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


class StreamReadRequest(Body, kw_only=True, omit_defaults=True):
    """Read (fan-out mode) the persistent messages of each stream from its token
    (``""``: from the oldest, ``"$"``: only newer ones), waiting up to ``wait_ms``."""

    api_key = ApiKey.STREAM_READ
    positions: dict[str, str] = msgspec.field(default_factory=dict)
    max_messages: int = 100
    wait_ms: int = 0


class StreamReadResponse(Body, kw_only=True, omit_defaults=True):
    """The messages read and, for every stream asked, the token to read it from next."""

    api_key = ApiKey.STREAM_READ
    messages: list[StreamMessage] = msgspec.field(default_factory=list)
    tokens: dict[str, str] = msgspec.field(default_factory=dict)
    error_code: int = 0
    error_message: str = ""


class StreamListRequest(Body, kw_only=True, omit_defaults=True):
    """Streams whose ids start with ``prefix``, sorted, after ``after``, at most ``limit``."""

    api_key = ApiKey.STREAM_LIST
    prefix: str = ""
    after: str = ""
    limit: int = 1000


class StreamListResponse(Body, kw_only=True, omit_defaults=True):
    """The streams the principal may describe; ``partitions``: of the shared logs;
    ``last``: the last id the broker looked at (the ``after`` of the next page; "" when
    there are no more)."""

    api_key = ApiKey.STREAM_LIST
    streams: list[StreamInfo] = msgspec.field(default_factory=list)
    partitions: int = 0
    last: str = ""
    error_code: int = 0
    error_message: str = ""


class StreamDescribeRequest(Body, kw_only=True, omit_defaults=True):
    """One stream (``info``), or with ``stream`` "" the counts over every stream
    (``stats``, which needs describe on the cluster)."""

    api_key = ApiKey.STREAM_DESCRIBE
    stream: str = ""


class StreamDescribeResponse(Body, kw_only=True, omit_defaults=True):
    """``info`` None: no such stream now."""

    api_key = ApiKey.STREAM_DESCRIBE
    info: StreamInfo | None = None
    stats: StreamStats | None = None
    error_code: int = 0
    error_message: str = ""


# --- replication (between the nodes of a cluster) ---------------------------------------------


class ReplicaFetchPartition(msgspec.Struct, array_like=True):
    """One partition a follower copies: from ``offset`` (its log end), in the leader epoch it
    knows, with the epoch of its last batch (the leader answers a divergence from it) and its
    fsynced end (counted under ``fsync=always``)."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int
    last_fetched_epoch: int = -1
    durable_offset: int = -1


class ReplicaFetchRequest(Body, kw_only=True, omit_defaults=True):
    """A follower node copying the leader's log of every partition it follows from it."""

    api_key = ApiKey.REPLICA_FETCH
    node_id: int
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 16 * 1024 * 1024
    partitions: list[ReplicaFetchPartition]


class ReplicaFetchResult(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One partition's answer; its batches (exactly as the leader's log holds them) are the
    next ``data_bytes`` bytes of the data section. ``diverging_epoch``/``diverging_end_offset``
    (not -1): the follower's log diverges from the leader's; it truncates to the smaller of
    ``diverging_end_offset`` and its own end and fetches again from there."""

    topic: str
    partition: int
    error_code: int = 0
    error_message: str = ""
    high_watermark: int = -1
    log_start_offset: int = -1
    leader_epoch: int = -1
    diverging_epoch: int = -1
    diverging_end_offset: int = -1
    data_bytes: int = 0


class ReplicaFetchResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.REPLICA_FETCH
    partitions: list[ReplicaFetchResult]


# --- a cluster topic's replication ----------------------------------------------------------


class PartitionReplicas(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A partition's replicas (the first is its preferred leader)."""

    partition: int
    replicas: list[int]


class PartitionReplication(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A partition of a cluster's topic: replicas, ISR, leader and leader epoch, and the
    target replica set of a move under way (empty: none)."""

    partition: int
    replicas: list[int]
    isr: list[int]
    leader: int
    leader_epoch: int
    target: list[int] = msgspec.field(default_factory=list)
    #: While a move is under way: the replicas it had when the move started (a cancel goes
    #: back to them; empty when not known).
    original: list[int] = msgspec.field(default_factory=list)


class AlterReplicationRequest(Body, kw_only=True, omit_defaults=True):
    """Change the replication of a cluster's topic: move partitions to other replica sets
    (``assignments``) or to ``replication_factor`` replicas each (not both), and/or set its
    ``min_insync_replicas`` or ``unclean_leader_election``. Nothing given: only the answer
    (the reassignment status). Refused on a single node."""

    api_key = ApiKey.ALTER_REPLICATION
    topic: str
    assignments: list[PartitionReplicas] = msgspec.field(default_factory=list)
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    unclean_leader_election: bool | None = None
    #: Cancel the moves under way of ``partitions`` (empty: every partition being moved),
    #: KIP-455's way: each goes back to the replicas it had before. Not with a move.
    cancel: bool = False
    partitions: list[int] = msgspec.field(default_factory=list)


class AlterReplicationResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.ALTER_REPLICATION
    #: Each partition after the request (moves started, not finished: see ``target``).
    partitions: list[PartitionReplication] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


# --- a cluster's figures ------------------------------------------------------------------------


class ClusterMetricsRequest(Body, kw_only=True, omit_defaults=True):
    """Every live node's key figures (docs/cluster.md, "Metrics and dashboard"): the
    answering node asks the others and names those that did not answer in time. Refused on a
    single node."""

    api_key = ApiKey.CLUSTER_METRICS
    #: Between the nodes of a cluster: only the answering node's own figures (never asked
    #: further).
    local: bool = False


class NodeMetricsBody(msgspec.Struct, kw_only=True):
    """One node's figures: counters since it started, rates over its last metrics sample
    (None: it keeps no samples), and its cluster state now."""

    node_id: int
    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    disk_used_bytes: int = 0
    messages_in_per_s: float | None = None
    bytes_in_per_s: float | None = None
    bytes_out_per_s: float | None = None
    partitions_led: int = 0
    under_replicated_partitions: int = 0
    under_min_isr_partitions: int = 0
    reassigning_partitions: int = 0
    #: Partitions without a leader: the controller's figure (-1 on the other nodes).
    offline_partitions: int = -1
    controller: bool = False
    isr_shrinks: int = 0
    isr_expands: int = 0
    leader_elections: int = 0
    replica_fetch_errors: int = 0
    lease_losses: int = 0
    lease_stale: bool = False
    lease_stale_periods: int = 0


class ClusterMetricsResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.CLUSTER_METRICS
    nodes: list[NodeMetricsBody] = msgspec.field(default_factory=list)
    #: Live nodes that did not answer in time (their figures are not in ``nodes``).
    missing_nodes: list[int] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""


# --- taking once: the msgbus mode's pops --------------------------------------------------------


class TakeRequest(Body, kw_only=True, omit_defaults=True):
    """Take the next record of a one-partition topic once for consumer group ``group`` (the
    record at its committed offset; the offset after it committed before the answer): the
    msgbus mode's pop, answered by the leader of the topic's partition, which serializes the
    takes (docs/http-compat.md). Another node forwards a pop it cannot serve with it."""

    api_key = ApiKey.TAKE
    topic: str
    group: str
    #: Records older than this (ms, by their timestamp) are passed over as taken; 0: none.
    ttl_ms: int = 0
    #: The sender's id of this take (empty: none): the leader answers a TAKE sent again with
    #: the same id (its connection broke) with what it took for the first, taking nothing more.
    take_id: str = ""


class TakeResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.TAKE
    #: False: nothing to take now (the topic is empty, or every record was taken).
    found: bool = False
    offset: int = -1
    timestamp_ms: int = 0
    value: bytes = b""
    error_code: int = 0
    error_message: str = ""


# --- a request forwarded by a node on behalf of its caller --------------------------------------


class EnvelopeRequest(Body, kw_only=True, omit_defaults=True):
    """A request a node of a cluster received and sends on to the node that serves it, on
    behalf of its caller (Kafka's Envelope, KIP-590; docs/protocol.md, "ENVELOPE"). Only a
    sender with ``cluster_action`` on the cluster (a node) may send one; the receiving node
    runs the inner request through its gate as the carried principal (so the caller's own
    permissions decide, and the audit log names the caller), and answers the inner response.
    An envelope never carries an envelope."""

    api_key = ApiKey.ENVELOPE
    #: The inner request's API key (one of the queue APIs that need no connection).
    request_api_key: int
    #: The inner request's body, encoded as its API's request (msgpack); its data parts are
    #: the envelope's.
    request_body: bytes
    #: The caller's principal ("": anonymous, as on a cluster without authentication).
    principal: str = ""
    #: Its kind as the gate knows it (``user``, ``service``, ``certificate``...).
    principal_kind: str = ""
    #: Where the caller came from (``host:port``) and over what (``http``...), for the audit.
    client_source: str = ""
    client_interface: str = ""
    #: The node that received the request and forwarded it.
    forwarded_by: int = -1


class EnvelopeResponse(Body, kw_only=True, omit_defaults=True):
    """The inner response (its body encoded as its API's response; its data parts are the
    envelope's), or the error that refused the inner request as a whole (not allowed to the
    carried principal, malformed, not an API an envelope carries)."""

    api_key = ApiKey.ENVELOPE
    response_body: bytes = b""
    error_code: int = 0
    error_message: str = ""


# --- an HTTP API publish forwarded to the leader -------------------------------------------------


class HttpPublishRequest(Body, kw_only=True, omit_defaults=True):
    """An HTTP API publish (``POST /v1/topics/{topic}/messages`` or ``messages:batch``) that
    a node of a cluster received for a partition led by another node, sent to that leader as
    it came (docs/cluster.md, "The HTTP API in a cluster"): the leader stores it as its own
    HTTP API would, ``Idempotency-Key`` included, so the answer is the one it would give."""

    api_key = ApiKey.HTTP_PUBLISH
    topic: str
    #: The HTTP request body, as received: a PublishRequest (or, with ``batch``, a
    #: BatchPublishRequest) JSON document.
    body: bytes
    batch: bool = False
    #: The request's ``Idempotency-Key`` header; None: none.
    idempotency_key: str | None = None


class PublishedAt(msgspec.Struct, array_like=True):
    """Where a message was stored: ``[partition, offset]``."""

    partition: int
    offset: int


class HttpPublishResponse(Body, kw_only=True, omit_defaults=True):
    api_key = ApiKey.HTTP_PUBLISH
    #: Where each message was stored, in the order sent.
    results: list[PublishedAt] = msgspec.field(default_factory=list)
    error_code: int = 0
    error_message: str = ""
    #: The class name of the error, where the code alone does not say how the HTTP API
    #: answers it (``IdempotencyKeyReusedError``: 409, with the code of an invalid request).
    error_name: str = ""


# --- the registry and the codec ------------------------------------------------------------

_SCHEMAS: dict[ApiKey, tuple[type[Body], type[Body]]] = {
    ApiKey.API_VERSIONS: (ApiVersionsRequest, ApiVersionsResponse),
    ApiKey.METADATA: (MetadataRequest, MetadataResponse),
    ApiKey.CREATE_TOPIC: (CreateTopicRequest, CreateTopicResponse),
    ApiKey.DELETE_TOPIC: (DeleteTopicRequest, DeleteTopicResponse),
    ApiKey.LIST_TOPICS: (ListTopicsRequest, ListTopicsResponse),
    ApiKey.DESCRIBE_TOPIC: (DescribeTopicRequest, DescribeTopicResponse),
    ApiKey.ALTER_TOPIC: (AlterTopicRequest, AlterTopicResponse),
    ApiKey.PRODUCE: (ProduceRequest, ProduceResponse),
    ApiKey.FETCH: (FetchRequest, FetchResponse),
    ApiKey.LIST_OFFSETS: (ListOffsetsRequest, ListOffsetsResponse),
    ApiKey.INIT_PRODUCER_ID: (InitProducerIdRequest, InitProducerIdResponse),
    ApiKey.PING: (PingRequest, PingResponse),
    ApiKey.JOIN_GROUP: (JoinGroupRequest, JoinGroupResponse),
    ApiKey.HEARTBEAT: (HeartbeatRequest, HeartbeatResponse),
    ApiKey.LEAVE_GROUP: (LeaveGroupRequest, LeaveGroupResponse),
    ApiKey.OFFSET_COMMIT: (OffsetCommitRequest, OffsetCommitResponse),
    ApiKey.OFFSET_FETCH: (OffsetFetchRequest, OffsetFetchResponse),
    ApiKey.LIST_GROUPS: (ListGroupsRequest, ListGroupsResponse),
    ApiKey.DESCRIBE_GROUP: (DescribeGroupRequest, DescribeGroupResponse),
    ApiKey.DELETE_GROUP: (DeleteGroupRequest, DeleteGroupResponse),
    ApiKey.RESET_OFFSETS: (ResetOffsetsRequest, ResetOffsetsResponse),
    ApiKey.SUBSCRIBE: (SubscribeRequest, SubscribeResponse),
    ApiKey.CREDIT: (CreditRequest, CreditResponse),
    ApiKey.UNSUBSCRIBE: (UnsubscribeRequest, UnsubscribeResponse),
    ApiKey.PRODUCER_STATE: (ProducerStateRequest, ProducerStateResponse),
    ApiKey.RELEASE_WRITERS: (ReleaseWritersRequest, ReleaseWritersResponse),
    ApiKey.REPAIR_TOPIC: (RepairTopicRequest, RepairTopicResponse),
    ApiKey.SASL_HANDSHAKE: (SaslHandshakeRequest, SaslHandshakeResponse),
    ApiKey.SASL_AUTHENTICATE: (SaslAuthenticateRequest, SaslAuthenticateResponse),
    ApiKey.WHOAMI: (WhoAmIRequest, WhoAmIResponse),
    ApiKey.CREATE_PRINCIPAL: (CreatePrincipalRequest, CreatePrincipalResponse),
    ApiKey.DELETE_PRINCIPAL: (DeletePrincipalRequest, DeletePrincipalResponse),
    ApiKey.DESCRIBE_PRINCIPALS: (DescribePrincipalsRequest, DescribePrincipalsResponse),
    ApiKey.ALTER_PRINCIPAL: (AlterPrincipalRequest, AlterPrincipalResponse),
    ApiKey.CREATE_API_KEY: (CreateApiKeyRequest, CreateApiKeyResponse),
    ApiKey.REVOKE_API_KEY: (RevokeApiKeyRequest, RevokeApiKeyResponse),
    ApiKey.ALTER_ACLS: (AlterAclsRequest, AlterAclsResponse),
    ApiKey.DESCRIBE_ACLS: (DescribeAclsRequest, DescribeAclsResponse),
    ApiKey.ALTER_QUOTAS: (AlterQuotasRequest, AlterQuotasResponse),
    ApiKey.DESCRIBE_QUOTAS: (DescribeQuotasRequest, DescribeQuotasResponse),
    ApiKey.DESCRIBE_AUDIT: (DescribeAuditRequest, DescribeAuditResponse),
    ApiKey.EXCHANGE_DECLARE: (ExchangeDeclareRequest, ExchangeDeclareResponse),
    ApiKey.EXCHANGE_DELETE: (ExchangeDeleteRequest, ExchangeDeleteResponse),
    ApiKey.QUEUE_DECLARE: (QueueDeclareRequest, QueueDeclareResponse),
    ApiKey.QUEUE_DELETE: (QueueDeleteRequest, QueueDeleteResponse),
    ApiKey.QUEUE_PURGE: (QueuePurgeRequest, QueuePurgeResponse),
    ApiKey.QUEUE_BIND: (QueueBindRequest, QueueBindResponse),
    ApiKey.QUEUE_UNBIND: (QueueUnbindRequest, QueueUnbindResponse),
    ApiKey.LIST_QUEUES: (ListQueuesRequest, ListQueuesResponse),
    ApiKey.LIST_EXCHANGES: (ListExchangesRequest, ListExchangesResponse),
    ApiKey.QUEUE_PUBLISH: (QueuePublishRequest, QueuePublishResponse),
    ApiKey.QUEUE_CONSUME: (QueueConsumeRequest, QueueConsumeResponse),
    ApiKey.QUEUE_CANCEL: (QueueCancelRequest, QueueCancelResponse),
    ApiKey.QUEUE_GET: (QueueGetRequest, QueueGetResponse),
    ApiKey.QUEUE_SETTLE: (QueueSettleRequest, QueueSettleResponse),
    ApiKey.QUEUE_BROWSE: (QueueBrowseRequest, QueueBrowseResponse),
    ApiKey.QUEUE_REPLAY: (QueueReplayRequest, QueueReplayResponse),
    ApiKey.STREAM_SEND: (StreamSendRequest, StreamSendResponse),
    ApiKey.STREAM_RECEIVE: (StreamReceiveRequest, StreamReceiveResponse),
    ApiKey.STREAM_READ: (StreamReadRequest, StreamReadResponse),
    ApiKey.STREAM_LIST: (StreamListRequest, StreamListResponse),
    ApiKey.STREAM_DESCRIBE: (StreamDescribeRequest, StreamDescribeResponse),
    ApiKey.REPLICA_FETCH: (ReplicaFetchRequest, ReplicaFetchResponse),
    ApiKey.ALTER_REPLICATION: (AlterReplicationRequest, AlterReplicationResponse),
    ApiKey.TAKE: (TakeRequest, TakeResponse),
    ApiKey.HTTP_PUBLISH: (HttpPublishRequest, HttpPublishResponse),
    ApiKey.CLUSTER_METRICS: (ClusterMetricsRequest, ClusterMetricsResponse),
    ApiKey.ENVELOPE: (EnvelopeRequest, EnvelopeResponse),
}
#: APIs only the server sends, as PUSH frames, with the body schema of each: they have no
#: request or response (a request for one is refused as an unknown API).
PUSH_SCHEMAS: dict[ApiKey, type[msgspec.Struct]] = {ApiKey.QUEUE_DELIVER: QueueDeliverBody}
#: (min, max) version of each API this code speaks. Version 0 is the first of each.
#: Push-only APIs are listed too, so a client can tell which pushes a server sends.
_VERSIONS: dict[ApiKey, tuple[int, int]] = dict.fromkeys([*_SCHEMAS, *PUSH_SCHEMAS], (0, 0))

#: What :func:`schema_for` looks up once a frame: API key (an int, as on the wire) -> its
#: versions and (request, response) schemas, for the APIs a client may request. Building
#: the ``ApiKey`` member from the int (an enum call, a few Python calls) is left to errors.
_REQUESTABLE: dict[int, tuple[int, int, tuple[type[Body], type[Body]]]] = {
    int(k): (*_VERSIONS[k], schemas) for k, schemas in _SCHEMAS.items() if k not in PUSH_SCHEMAS
}

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {}


def supported_versions() -> list[ApiVersionRange]:
    """Every API with the range of versions this side speaks."""
    return [ApiVersionRange(int(k), lo, hi) for k, (lo, hi) in sorted(_VERSIONS.items())]


def schema_for(api_key: int, version: int, *, response: bool) -> type[Body]:
    """The body schema of ``api_key`` at ``version``.

    Raises:
        UnknownApiError: no such API, or one the server only pushes (:data:`PUSH_SCHEMAS`).
        UnsupportedVersionError: ``version`` is outside the supported range.
    """
    found = _REQUESTABLE.get(api_key)
    if found is not None and found[0] <= version <= found[1]:
        return found[2][1 if response else 0]
    try:
        key = ApiKey(api_key)
    except ValueError:
        raise UnknownApiError(f"unknown API key {api_key}") from None
    if key in PUSH_SCHEMAS:
        raise UnknownApiError(f"{key.name} ({int(key)}) is pushed by the server, never requested")
    lo, hi = _VERSIONS[key]
    if not lo <= version <= hi:
        raise UnsupportedVersionError(
            f"{key.name} version {version} is not supported (supported: {lo}..{hi})"
        )
    return _SCHEMAS[key][1 if response else 0]


def encode_body(body: msgspec.Struct) -> bytes:
    """Encode a body to msgpack."""
    return _encoder.encode(body)


def decode_body(schema: type[msgspec.Struct], data: bytes | memoryview) -> Any:
    """Decode and validate ``data`` as ``schema``.

    Raises:
        InvalidRequestError: malformed msgpack, or a field missing or of the wrong type (the
            message names the field).
    """
    dec = _decoders.get(schema)
    if dec is None:
        dec = _decoders[schema] = msgspec.msgpack.Decoder(schema)
    try:
        return dec.decode(data)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise InvalidRequestError(f"invalid {schema.__name__}: {exc}") from None
    except UnicodeDecodeError as exc:  # msgspec reports bad UTF-8 in a str field this way
        raise InvalidRequestError(
            f"invalid {schema.__name__}: a string is not UTF-8 ({exc})"
        ) from None
    except RecursionError:  # msgpack nested deeper than the decoder's stack allows
        raise InvalidRequestError(f"invalid {schema.__name__}: nested too deeply") from None
