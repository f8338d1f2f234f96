"""The native API's request and response documents (pydantic v2 models: they validate the
requests, and the OpenAPI spec is generated from them).

Payloads travel as text: ``encoding: "utf-8"`` (the default) sends a message's key, value and
header values as UTF-8 text; ``encoding: "base64"`` sends them base64-encoded (any bytes).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "BatchPublishRequest",
    "BatchPublishResult",
    "CommitOffset",
    "CommitRequest",
    "CommitResult",
    "CreateTopicRequest",
    "ErrorBody",
    "ErrorDetail",
    "GroupDescription",
    "GroupList",
    "GroupMember",
    "GroupPartitionLag",
    "GroupSummary",
    "Message",
    "MessagePage",
    "PartitionDescription",
    "PublishMessage",
    "PublishRequest",
    "PublishResult",
    "ResetPartition",
    "ResetRequest",
    "ResetResult",
    "TimeRangePage",
    "TopicConfig",
    "TopicDescription",
    "TopicList",
    "TopicSummary",
]

#: How a message's key, value and header values are written in JSON.
Encoding = Literal["utf-8", "base64"]
#: The largest partition index (as the broker's MAX_PARTITION allows).
_MAX_P = 100_000
_I64 = 2**63 - 1

Partition = Annotated[int, Field(ge=0, lt=_MAX_P, description="A partition index.")]
Offset = Annotated[int, Field(ge=0, le=_I64, description="An offset in a partition's log.")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class DamagedRange(BaseModel):
    start: int = Field(description="The first offset of the damaged range.")
    end: int = Field(description="The first offset after it: where reading can go on.")


class ErrorDetail(BaseModel):
    code: int = Field(description="tidewire's error code (that of the binary protocol).")
    name: str = Field(description="The error's class, e.g. UnknownTopicError.")
    message: str = Field(description="What went wrong, naming the values involved.")
    damaged_range: DamagedRange | None = Field(
        default=None,
        description="With code 32 (PartitionCorruptError): the damaged range holding the "
        "offset asked for; its records are never served.",
    )


class ErrorBody(BaseModel):
    """Every error answer."""

    error: ErrorDetail


# --- topics --------------------------------------------------------------------------------------


class TopicConfig(_Strict):
    """A topic's log settings; a setting left out takes the broker's default."""

    retention_ms: Annotated[int, Field(ge=-1, le=_I64)] | None = None
    retention_bytes: Annotated[int, Field(ge=-1, le=_I64)] | None = None
    segment_bytes: Annotated[int, Field(ge=1024, le=2**31 - 1)] | None = None
    segment_ms: Annotated[int, Field(ge=1, le=_I64)] | None = None
    fsync: Literal["always", "interval", "never"] | None = None
    flush_interval_ms: Annotated[int, Field(ge=1, le=3_600_000)] | None = None
    max_message_bytes: Annotated[int, Field(ge=61, le=256 * 1024 * 1024)] | None = Field(
        default=None, description="The largest record batch (one publish) accepted, bytes."
    )


class CreateTopicRequest(_Strict):
    name: str = Field(
        description="1..200 characters of [A-Za-z0-9._-], not '.' or '..'.",
        max_length=10_000,
    )
    partitions: Annotated[int, Field(ge=1, le=_MAX_P)] | None = Field(
        default=None, description="Partition count (the broker's default_partitions if absent)."
    )
    config: TopicConfig | None = None
    replication_factor: Annotated[int, Field(ge=1, le=100)] | None = Field(
        default=None,
        description="In a cluster: copies of each partition (the nodes' default if absent). "
        "Refused above 1 on a single node.",
    )
    min_insync_replicas: Annotated[int, Field(ge=1, le=100)] | None = Field(
        default=None,
        description="In a cluster: in-sync replicas acks=all needs (the nodes' default, at "
        "most the replication factor, if absent). Refused above 1 on a single node.",
    )
    unclean_leader_election: bool | None = Field(
        default=None,
        description="In a cluster: let a replica out of sync lead when no in-sync one is "
        "left (what it lacks is lost). Refused on a single node.",
    )


class AlterTopicRequest(_Strict):
    """What to change: settings left out keep their current values."""

    partitions: Annotated[int, Field(ge=1, le=_MAX_P)] | None = Field(
        default=None, description="The new partition count (more than now; never fewer)."
    )
    config: TopicConfig | None = Field(
        default=None, description="The settings to change (the others stay as they are)."
    )
    min_insync_replicas: Annotated[int, Field(ge=1, le=100)] | None = Field(
        default=None,
        description="In a cluster: in-sync replicas acks=all needs (1..replication factor).",
    )
    unclean_leader_election: bool | None = Field(
        default=None, description="In a cluster: let a replica out of sync lead."
    )


class TopicSummary(BaseModel):
    name: str
    partitions: int
    size_bytes: int = Field(description="Bytes of its online partitions' logs.")
    messages: int = Field(
        description="End minus start offsets over its online partitions (compaction and "
        "transaction markers make it an upper bound)."
    )


class TopicList(BaseModel):
    topics: list[TopicSummary]
    total: int = Field(description="Topics that match the filter, over every page.")
    next: int | None = Field(description="The offset of the next page; null: this is the last.")


class DamageDescription(BaseModel):
    start: int = Field(description="The first offset of the damaged range.")
    end: int = Field(description="The first offset after it.")
    size_bytes: int = Field(description="Damaged bytes.")
    file: str = Field(description="The segment file holding them.")
    position: int = Field(description="Their byte position in that file.")
    reason: str = Field(description="The check that failed.")
    quarantined: str | None = Field(
        description="The file holding a copy of the bytes once quarantined (readers then "
        "pass the range as a gap), else null."
    )


class PartitionDescription(BaseModel):
    partition: int
    start_offset: int = Field(description="The oldest offset still in the log.")
    end_offset: int = Field(description="The offset the next message gets.")
    high_watermark: int = Field(description="Offsets below it are visible to readers.")
    size_bytes: int
    damage: list[DamageDescription] | None = Field(
        default=None,
        description="Damaged ranges of the log (absent when there are none): refused to "
        "readers (422) until quarantined; `tidewire topic repair` quarantines or truncates.",
    )
    offline: str | None = Field(
        default=None,
        description="Why the partition could not be opened (absent when it serves); its "
        "requests are answered 503 with code 37.",
    )
    leader: int | None = Field(
        default=None,
        description="In a cluster (absent on a single node): the node leading the partition "
        "(-1: none now, offline). Offsets and size are this node's replica's; -1 where the "
        "node holds no replica.",
    )
    leader_epoch: int | None = Field(default=None, description="In a cluster: the leader epoch.")
    replicas: list[int] | None = Field(
        default=None, description="In a cluster: the nodes holding a replica."
    )
    isr: list[int] | None = Field(default=None, description="In a cluster: the in-sync replicas.")


class TopicDescription(BaseModel):
    name: str
    partitions: list[PartitionDescription]
    config: TopicConfig
    replication_factor: int | None = Field(
        default=None,
        description="In a cluster (absent on a single node): copies of each partition.",
    )
    min_insync_replicas: int | None = Field(
        default=None, description="In a cluster: the in-sync replicas acks=all needs."
    )
    unclean_leader_election: bool | None = Field(
        default=None, description="In a cluster: whether a replica out of sync may lead."
    )


# --- publish -------------------------------------------------------------------------------------


class PublishMessage(_Strict):
    """One message. Without ``partition``: by the key's hash (FNV-1a, as the tidewire
    clients route), or round-robin when there is no key. ``payload`` is another name for
    ``value`` (pubsub-broker's gateway spells it so; docs/migrating.md): give one of them."""

    key: str | None = Field(default=None, max_length=2**30)
    value: str | None = Field(default=None, max_length=2**30, description="null: a tombstone.")
    payload: str | None = Field(
        default=None,
        max_length=2**30,
        description="Another name for value; a message gives value or payload, not both.",
    )
    headers: dict[str, str | None] | None = Field(
        default=None, description="Header name -> value (encoded as the message's encoding)."
    )
    partition: Partition | None = None
    timestamp: Annotated[int, Field(ge=0, le=_I64)] | None = Field(
        default=None, description="Create time, ms since the epoch (now if absent)."
    )

    @model_validator(mode="after")
    def _payload_is_value(self) -> PublishMessage:
        if "payload" in self.model_fields_set:
            if "value" in self.model_fields_set:
                raise ValueError("give value or payload (another name for value), not both")
            self.value, self.payload = self.payload, None
        return self


class PublishRequest(PublishMessage):
    encoding: Encoding = "utf-8"


class PublishResult(BaseModel):
    """Where the message was stored."""

    partition: int
    offset: int


class BatchPublishRequest(_Strict):
    messages: list[PublishMessage] = Field(min_length=1, max_length=100_000)
    encoding: Encoding = "utf-8"


class BatchPublishResult(BaseModel):
    """Where each message was stored, in the order of the request."""

    results: list[PublishResult]


# --- read ----------------------------------------------------------------------------------------


class Message(BaseModel):
    """One stored message; ``encoding`` says how its key, value and header values are
    written (UTF-8 text when every one is valid UTF-8, else base64, unless base64 was
    asked for)."""

    partition: int
    offset: int
    timestamp: int
    key: str | None
    value: str | None
    headers: dict[str, str | None]
    encoding: Encoding


class MessagePage(BaseModel):
    messages: list[Message]
    next_offset: int = Field(description="The offset to ask for next.")
    high_watermark: int
    gaps: list[DamagedRange] | None = Field(
        default=None,
        description="With skip_damaged=true: the damaged ranges read past (their records "
        "are lost); absent when there were none.",
    )
    scanned: int | None = Field(
        default=None,
        description="With q or key: the records looked at (at most max_scan); next_offset "
        "follows the last one, so a search goes on from there. Absent without a filter.",
    )


class TimeRangePage(BaseModel):
    messages: list[Message]
    next_offsets: dict[str, int] = Field(
        description="Partition -> the offset to continue from (as a string key)."
    )


# --- groups --------------------------------------------------------------------------------------


class GroupSummary(BaseModel):
    group: str
    state: str
    members: int
    lag: int = Field(
        description="Messages behind over the partitions it committed offsets for (those "
        "without a commit do not count)."
    )


class GroupList(BaseModel):
    groups: list[GroupSummary]
    total: int = Field(description="Groups that match the filter, over every page.")
    next: int | None = Field(description="The offset of the next page; null: this is the last.")


class GroupMember(BaseModel):
    member_id: str
    group_instance_id: str = Field(description="Empty: a dynamic member.")
    client_id: str
    topics: list[str]
    pattern: str = Field(description="The subscription's regular expression, or empty.")
    assignment: list[tuple[str, int]] = Field(description="[topic, partition] pairs.")


class GroupPartitionLag(BaseModel):
    topic: str
    partition: int
    committed: int = Field(description="-1: nothing committed.")
    end_offset: int
    lag: int = Field(description="-1: nothing committed.")
    metadata: str


class GroupDescription(BaseModel):
    group: str
    state: str
    generation: int
    strategy: str
    members: list[GroupMember]
    offsets: list[GroupPartitionLag]


class CommitOffset(_Strict):
    topic: str = Field(max_length=10_000)
    partition: Partition
    offset: Offset = Field(description="The next offset to read.")
    metadata: str = Field(default="", max_length=4096)


class CommitRequest(_Strict):
    offsets: list[CommitOffset] = Field(min_length=1, max_length=10_000)
    member_id: str = Field(default="", description="Empty: a commit from outside the group.")
    generation: int = Field(default=-1, ge=-1, le=2**31 - 1)


class CommitResult(BaseModel):
    group: str
    offsets: list[CommitOffset]


class ResetRequest(_Strict):
    """Move a group's committed offsets (the group must have no members), as ``tidewire
    group reset`` does."""

    topic: str = Field(max_length=10_000)
    to: Literal["earliest", "latest", "offset", "timestamp"]
    offset: Offset | None = Field(default=None, description="For to=offset (clamped).")
    timestamp: Annotated[int, Field(ge=0, le=_I64)] | None = Field(
        default=None, description="For to=timestamp: ms since the epoch."
    )
    partitions: list[Partition] | None = Field(
        default=None, max_length=10_000, description="Only these (all if absent)."
    )
    dry_run: bool = False


class ResetPartition(BaseModel):
    topic: str
    partition: int
    previous: int = Field(description="-1: nothing was committed.")
    offset: int
    end_offset: int = Field(description="The partition's end (high watermark) now.")
    lag: int = Field(description="Messages behind once at offset: end_offset - offset.")


class ResetResult(BaseModel):
    group: str
    dry_run: bool
    partitions: list[ResetPartition]
