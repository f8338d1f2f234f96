"""Every error tidewire reports, one class per wire error code.

The tree::

    TidewireError                     code, retriable, description; registry by code
    ├── RecordBatchError              a record batch that cannot be accepted (never retriable)
    │   ├── CorruptBatchError         CRC-32C mismatch
    │   ├── InvalidMagicError         magic byte is not 2
    │   ├── BatchLengthError          lengths that do not add up, truncated input
    │   ├── RecordCountError          record count disagrees with the records present
    │   ├── VarintError               a varint longer than its type allows
    │   ├── InvalidRecordError        a record whose fields are malformed
    │   ├── UnsupportedCompressionError  compression codec tidewire does not implement
    │   └── DecompressionLimitError   decompressed data larger than the allowed limit
    ├── StorageError                  the disk refused: EIO, ENOSPC, failed fsync (retriable)
    ├── LogFailedError                a log that stopped accepting writes after an fsync failure
    ├── PartitionCorruptError         an offset in a damaged range of a log (never served)
    ├── PartitionOfflineError         a partition that could not be opened at start
    ├── OffsetOutOfRangeError         an offset below the log start or above the log end
    ├── BatchTooLargeError            a batch larger than the configured limit
    ├── InvalidConfigError            a configuration value out of its range
    ├── LogClosedError                an operation on a log that was closed or deleted
    ├── LogNotFoundError              no log for that topic and partition
    ├── LogExistsError                a log for that topic and partition exists already
    ├── DataDirLockedError            the data directory is held by another broker
    ├── BackpressureError             a bounded queue is full (retriable)
    ├── ShuttingDownError             the broker is draining: retry, there or elsewhere (retriable)
    ├── UnknownTopicError             no such topic (auto-creation off)
    ├── TopicExistsError              a topic of that name exists already
    ├── InvalidTopicError             a topic name or partition count that is not allowed
    │   └── InternalTopicError        a client's create, alter, delete or publish of a
    │                                 broker-internal topic (or a reserved ``__`` name)
    ├── UnknownPartitionError         no such partition in the topic
    ├── RequestTimedOutError          the request did not complete in its timeout (retriable)
    ├── ConnectionLostError           (client side) the connection broke (retriable)
    ├── ProducerFencedError           a producer epoch older than the producer id's newest
    ├── OutOfOrderSequenceError       a producer sequence that skips or goes back
    ├── DuplicateSequenceError        a batch sent again that is too old to answer with offsets
    ├── BufferFullError               (client side) the producer's buffer stayed full
    ├── ProducerClosedError           (client side) a send to a producer that was closed
    ├── IllegalGenerationError        a group request from a generation that is not the current one
    ├── UnknownMemberError            a member id the group does not know (expired, left, replaced)
    ├── RebalanceInProgressError      the group is rebalancing: rejoin (retriable)
    ├── InconsistentGroupProtocolError  a member's strategy differs from the group's
    ├── UnknownGroupError             no such consumer group
    ├── GroupNotEmptyError            an operation that needs a group without members
    ├── InvalidGroupError             a bad group id, subscription, strategy or timeout
    ├── PartitionNotAssignedError     a commit for a partition the member does not own
    ├── GroupFullError                a group or the coordinator holds as many as allowed
    ├── AuthenticationFailedError     no credentials, wrong ones, or an expired or revoked key
    ├── AuthorizationFailedError      the principal lacks the permission the request needs
    ├── UnsupportedSaslMechanismError  a SASL mechanism the broker does not offer here
    ├── TooManyAuthFailuresError      too many failed attempts from this address or principal
    ├── UnknownPrincipalError         no such user, service account or API key
    ├── PrincipalExistsError          a principal of that name exists already
    ├── UnknownQueueError             no such queue
    ├── UnknownExchangeError          no such exchange
    ├── PreconditionFailedError       a declare that disagrees with what exists, or an
    │                                 operation the object's state forbids
    ├── QueueLockedError              an exclusive queue of another connection
    ├── UnroutableError               a mandatory publish that no binding routes anywhere
    ├── QueueFullError                a queue at max_length with overflow=reject-publish
    │                                 (retriable, a subclass of BackpressureError)
    ├── UnknownDeliveryTagError       a settle of a delivery this consumer does not hold
    ├── InvalidQueueError             a bad queue, exchange or binding name or argument
    ├── InvalidStreamError            a bad stream id, resume token, TTL or argument
    ├── StreamFullError               a blocking send whose stream stayed full (retriable,
    │                                 a subclass of BackpressureError)
    └── TooManyStreamsError           a new stream beyond stream_max_count (retriable, a
                                      subclass of BackpressureError)
    └── ProtocolError                 a frame that breaks the binary protocol
        ├── FrameTooLargeError        a frame longer than the connection's limit
        ├── UnknownApiError           an API key the peer does not implement
        ├── UnsupportedVersionError   an API version outside the supported range
        ├── InvalidRequestError       a body that does not match the API's schema
        └── TooManyRequestsError      more requests in flight than allowed (retriable)

Clients decide to retry by :attr:`TidewireError.retriable`, never by matching messages. The
registry maps a wire code to its class: :func:`for_code`.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AuthenticationFailedError",
    "AuthorizationFailedError",
    "BackpressureError",
    "BatchLengthError",
    "BatchTooLargeError",
    "BufferFullError",
    "ConnectionLostError",
    "CorruptBatchError",
    "DataDirLockedError",
    "DecompressionLimitError",
    "DuplicateSequenceError",
    "FencedLeaderEpochError",
    "FrameTooLargeError",
    "GroupFullError",
    "GroupNotEmptyError",
    "IllegalGenerationError",
    "InconsistentGroupProtocolError",
    "InternalTopicError",
    "InvalidConfigError",
    "InvalidGroupError",
    "InvalidMagicError",
    "InvalidQueueError",
    "InvalidRecordError",
    "InvalidRequestError",
    "InvalidStreamError",
    "InvalidTopicError",
    "LogClosedError",
    "LogExistsError",
    "LogFailedError",
    "LogNotFoundError",
    "NotCoordinatorError",
    "NotEnoughReplicasAfterAppendError",
    "NotEnoughReplicasError",
    "NotLeaderError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "PartitionCorruptError",
    "PartitionNotAssignedError",
    "PartitionOfflineError",
    "PreconditionFailedError",
    "PrincipalExistsError",
    "ProducerClosedError",
    "ProducerFencedError",
    "ProtocolError",
    "QueueFullError",
    "QueueLockedError",
    "RebalanceInProgressError",
    "RecordBatchError",
    "RecordCountError",
    "ReplicaAppendError",
    "RequestTimedOutError",
    "ShuttingDownError",
    "StorageError",
    "StreamFullError",
    "TidewireError",
    "TooManyAuthFailuresError",
    "TooManyRequestsError",
    "TooManyStreamsError",
    "TopicExistsError",
    "UnknownApiError",
    "UnknownDeliveryTagError",
    "UnknownError",
    "UnknownExchangeError",
    "UnknownGroupError",
    "UnknownLeaderEpochError",
    "UnknownMemberError",
    "UnknownPartitionError",
    "UnknownPrincipalError",
    "UnknownQueueError",
    "UnknownTopicError",
    "UnroutableError",
    "UnsupportedCompressionError",
    "UnsupportedSaslMechanismError",
    "UnsupportedVersionError",
    "VarintError",
    "fetch_error",
    "for_code",
]

_REGISTRY: dict[int, type[TidewireError]] = {}


class TidewireError(Exception):
    """Base of every tidewire error.

    Attributes:
        code: the wire error code (a positive int16), unique per class.
        retriable: whether the same request may succeed if sent again.
        description: one line saying what the code means.
    """

    code: ClassVar[int] = -1
    retriable: ClassVar[bool] = False
    description: ClassVar[str] = "an error"

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            if cls.code in _REGISTRY:
                raise RuntimeError(f"error code {cls.code} registered twice")
            _REGISTRY[cls.code] = cls

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.description)

    @property
    def message(self) -> str:
        """The human-readable message."""
        return str(self.args[0])


def for_code(code: int) -> type[TidewireError]:
    """Return the error class registered for a wire ``code`` (``UnknownError`` if none)."""
    return _REGISTRY.get(code, UnknownError)


def fetch_error(
    code: int, message: str, damage_start: int = -1, damage_end: int = -1
) -> TidewireError:
    """The error a fetch result's ``error_code`` stands for, with the damaged range of a
    :class:`PartitionCorruptError` (the result's ``damage_start``/``damage_end``)."""
    cls = for_code(code)
    if issubclass(cls, PartitionCorruptError):
        return cls(message, damage_start=damage_start, damage_end=damage_end)
    return cls(message)


class UnknownError(TidewireError):
    code = 1
    description = "an unexpected error on the broker"


# --- record batches (codes 10-29) -------------------------------------------------------------


class RecordBatchError(TidewireError):
    """A record batch that cannot be accepted. Resending the same bytes cannot help."""

    code = 10
    description = "the record batch is malformed"


class CorruptBatchError(RecordBatchError):
    code = 11
    description = "the record batch's CRC-32C does not match its contents"


class InvalidMagicError(RecordBatchError):
    code = 12
    description = "the record batch's magic byte is not 2"


class BatchLengthError(RecordBatchError):
    code = 13
    description = "the record batch's lengths do not add up"


class RecordCountError(RecordBatchError):
    code = 14
    description = "the record count disagrees with the records in the batch"


class VarintError(RecordBatchError):
    code = 15
    description = "a varint is longer than its type allows"


class InvalidRecordError(RecordBatchError):
    code = 16
    description = "a record inside the batch is malformed"


class UnsupportedCompressionError(RecordBatchError):
    code = 17
    description = "the batch uses a compression codec tidewire does not support"


class DecompressionLimitError(RecordBatchError):
    code = 18
    description = "the batch decompresses to more bytes than allowed"


class BatchTooLargeError(TidewireError):
    code = 19
    description = "the record batch is larger than the configured limit"


# --- storage (codes 30-49) ---------------------------------------------------------------------


class StorageError(TidewireError):
    """The disk refused an operation (EIO, ENOSPC, a failed fsync)."""

    code = 30
    retriable = True
    description = "the storage device reported an error"


class LogFailedError(TidewireError):
    """An fsync failed earlier; the log accepts no writes until it is reopened and recovered."""

    code = 31
    description = "the log stopped accepting writes after a storage failure"


class PartitionCorruptError(TidewireError):
    """The requested offset lies in a damaged range of the log: its bytes failed their checks
    and are never served. Every offset outside the range is still served and the partition
    still accepts writes; a reader may seek to :attr:`damage_end` to go on past the gap.

    Attributes:
        damage_start: the first offset of the damaged range (-1 when unknown).
        damage_end: the first offset after it: where reading can go on (-1 when unknown).
    """

    code = 32
    description = "the requested offset lies in a damaged range of the partition's log"

    def __init__(
        self, message: str | None = None, *, damage_start: int = -1, damage_end: int = -1
    ) -> None:
        super().__init__(message)
        self.damage_start = damage_start
        self.damage_end = damage_end


class OffsetOutOfRangeError(TidewireError):
    code = 33
    description = "the offset is outside the log's range"


class LogClosedError(TidewireError):
    code = 34
    description = "the log is closed"


class LogNotFoundError(TidewireError):
    code = 35
    description = "no log exists for that topic and partition"


class LogExistsError(TidewireError):
    code = 36
    description = "a log exists already for that topic and partition"


class PartitionOfflineError(TidewireError):
    """The partition could not be opened when the broker started (its reason is in the
    message, in ``topic describe`` and in ``health``); the broker's other partitions serve."""

    code = 37
    description = "the partition is offline: it could not be opened"


class InvalidConfigError(TidewireError):
    code = 40
    description = "a configuration value is invalid"


class BackpressureError(TidewireError):
    code = 41
    retriable = True
    description = "a bounded queue is full; retry later"


class DataDirLockedError(TidewireError):
    """Another broker (another process, or another broker in this one) holds the data
    directory's lock: two brokers writing one directory would lose acknowledged messages.
    Its message names the directory and the holder's pid."""

    code = 42
    description = "the data directory is in use by another broker"


class ShuttingDownError(TidewireError):
    """The broker is draining (SIGTERM): it takes no new requests and closes the connection
    once the requests in flight are answered. Nothing of the refused request was done."""

    code = 43
    retriable = True
    description = "the broker is shutting down; retry, on another broker or once it is back"


# --- protocol (codes 50-69) --------------------------------------------------------------------


class ProtocolError(TidewireError):
    """A frame that breaks the binary protocol: the connection that sent it is closed. Its
    subclasses for a well-framed request that cannot be served (unknown API, unsupported
    version, invalid body) fail only that request."""

    code = 50
    description = "the frame is malformed"


class FrameTooLargeError(ProtocolError):
    code = 51
    description = "the frame is larger than the connection allows"


class UnknownApiError(ProtocolError):
    code = 52
    description = "the API key is not implemented"


class UnsupportedVersionError(ProtocolError):
    code = 53
    description = "the API version is outside the supported range"


class InvalidRequestError(ProtocolError):
    code = 54
    description = "the message body does not match the API's schema"


class TooManyRequestsError(ProtocolError):
    code = 55
    retriable = True
    description = "too many requests are in flight on this connection"


# --- broker (codes 70-89) ----------------------------------------------------------------------


class UnknownTopicError(TidewireError):
    code = 70
    description = "the topic does not exist"


class TopicExistsError(TidewireError):
    code = 71
    description = "a topic of that name exists already"


class InvalidTopicError(TidewireError):
    code = 72
    description = "the topic name or partition count is not allowed"


class InternalTopicError(InvalidTopicError):
    """Topics the broker keeps for itself (``__consumer_offsets``) are read-only for
    clients: they cannot create, alter, delete or publish to them; names beginning with
    ``__`` are reserved for such topics, so a client cannot create one."""

    code = 90
    description = "the topic is internal to the broker: clients may only read it"


class UnknownPartitionError(TidewireError):
    code = 73
    description = "the topic has no such partition"


class RequestTimedOutError(TidewireError):
    code = 74
    retriable = True
    description = "the request did not complete within its timeout"


class ConnectionLostError(TidewireError):
    """Raised by clients: the connection to the broker broke or could not be made. The
    request may or may not have reached the broker."""

    code = 75
    retriable = True
    description = "the connection to the broker was lost"


class ProducerFencedError(TidewireError):
    """A newer instance of the same producer id (a higher epoch) has started; this one may
    not write any more."""

    code = 76
    description = "a newer epoch of this producer id exists; this producer is fenced"


class OutOfOrderSequenceError(TidewireError):
    """An idempotent batch whose sequence is not the next one the partition expects: a batch
    in between was lost, or the producer's sequences are wrong. Nothing of it was stored."""

    code = 77
    description = "the batch's producer sequence is not the next one expected"


class DuplicateSequenceError(TidewireError):
    """An idempotent batch sent again that the partition stored already, but too long ago to
    answer with its offsets (only the last few batches per producer are remembered)."""

    code = 78
    description = "the batch was stored before; its offsets are no longer known"


class BufferFullError(TidewireError):
    """Raised by the producer: its buffer memory stayed full for longer than it may wait."""

    code = 79
    retriable = True
    description = "the producer's buffer is full"


class ProducerClosedError(TidewireError):
    """Raised by the producer: a send after close, or a message still buffered when the
    producer was closed without flushing."""

    code = 80
    description = "the producer is closed"


# --- consumer groups (codes 81-89) ---------------------------------------------------------------


class IllegalGenerationError(TidewireError):
    """A heartbeat or commit that names a generation other than the group's current one: the
    member missed a rebalance and must rejoin before it may commit."""

    code = 81
    description = "the group generation is not the current one; rejoin the group"


class UnknownMemberError(TidewireError):
    """The member id is not in the group: its session expired, it left, or a newer instance
    with the same ``group_instance_id`` replaced it. It must join again without that id."""

    code = 82
    description = "the member id is unknown to the group"


class RebalanceInProgressError(TidewireError):
    code = 83
    retriable = True
    description = "the group is rebalancing; rejoin it"


class InconsistentGroupProtocolError(TidewireError):
    code = 84
    description = "the member's assignment strategy differs from the group's"


class UnknownGroupError(TidewireError):
    code = 85
    description = "the consumer group does not exist"


class GroupNotEmptyError(TidewireError):
    """Deleting a group, or resetting its offsets, needs a group at rest (no members)."""

    code = 86
    description = "the group has members; the operation needs an empty group"


class InvalidGroupError(TidewireError):
    code = 87
    description = "the group id, subscription, strategy or timeout is not allowed"


class PartitionNotAssignedError(TidewireError):
    """A commit for a partition the group did not assign to that member in its generation."""

    code = 88
    description = "the partition is not assigned to this member"


class GroupFullError(TidewireError):
    code = 89
    description = "the group, or the coordinator, holds as many members or groups as allowed"


# --- security ---------------------------------------------------------------------------------


class AuthenticationFailedError(TidewireError):
    """No credentials where they are required, wrong ones, or an expired or revoked key. The
    message never contains the key or anything derived from it."""

    code = 100
    description = "authentication failed"


class AuthorizationFailedError(TidewireError):
    """The authenticated principal lacks the permission the request needs; nothing changed."""

    code = 101
    description = "not authorized"


class UnsupportedSaslMechanismError(TidewireError):
    code = 102
    description = "the SASL mechanism is not offered by the broker on this connection"


class TooManyAuthFailuresError(TidewireError):
    """Failed authentications from one address or for one principal went past the limit:
    attempts are refused until the window passes (retriable, after a wait)."""

    code = 103
    retriable = True
    description = "too many failed authentication attempts: wait and retry"


class UnknownPrincipalError(TidewireError):
    code = 104
    description = "no such principal or API key"


class PrincipalExistsError(TidewireError):
    code = 105
    description = "a principal of that name exists already"


# --- queues and exchanges ------------------------------------------------------------------------


class UnknownQueueError(TidewireError):
    code = 110
    description = "no such queue"


class UnknownExchangeError(TidewireError):
    code = 111
    description = "no such exchange"


class PreconditionFailedError(TidewireError):
    """A declare whose settings differ from those of the queue or exchange of that name, or
    an operation its state forbids (deleting a queue that is not empty with ``if_empty``)."""

    code = 112
    description = "the queue or exchange exists with other settings, or its state forbids this"


class QueueLockedError(TidewireError):
    """An exclusive queue, used from a connection other than the one that declared it."""

    code = 113
    description = "the queue is exclusive to another connection"


class UnroutableError(TidewireError):
    """A publish with ``mandatory`` that no binding routed to a queue or topic (and no
    alternate exchange took): nothing was stored."""

    code = 114
    description = "a mandatory message that no binding routes"


class QueueFullError(BackpressureError):
    """A queue at its ``max_length`` or ``max_length_bytes`` with ``overflow=reject-publish``:
    the publish is refused whole, nothing of it stored; retry once consumers caught up."""

    code = 115
    retriable = True
    description = "a queue is at its length limit; retry once consumers caught up"


class UnknownDeliveryTagError(TidewireError):
    """An ack, nack or reject of a delivery tag this consumer (or connection) does not hold:
    already settled, redelivered elsewhere after a timeout, or never given."""

    code = 116
    description = "no such delivery held by this consumer"


class InvalidQueueError(TidewireError):
    code = 117
    description = "a queue, exchange or binding name or argument that is not allowed"


# --- lightweight streams -------------------------------------------------------------------------


class InvalidStreamError(TidewireError):
    """A stream id, resume token, TTL or other argument of a stream operation that is not
    allowed (the message names which and why)."""

    code = 120
    description = "a stream id, resume token or argument that is not allowed"


class StreamFullError(BackpressureError):
    """A blocking send whose stream stayed at its ``ring_size`` waiting messages (plus one per
    receiver waiting) for the whole of ``block_ms``: nothing was stored; retry later."""

    code = 121
    retriable = True
    description = "the stream's waiting messages are at its size; retry once receivers caught up"


class TooManyStreamsError(BackpressureError):
    """A send or receive that would create a stream beyond the broker's ``stream_max_count``:
    nothing was stored; retry once idle streams have been forgotten."""

    code = 122
    retriable = True
    description = "the broker holds as many streams as it may"


# --- the cluster ---------------------------------------------------------------------------------


class NotLeaderError(TidewireError):
    """A produce or fetch sent to a node that does not lead the partition (a follower, or a
    former leader): nothing was stored. Refresh the metadata and send it to the leader, which
    the message names when this node knows it (also as ``leader_id``, ``leader_host`` and
    ``leader_port``; -1 and "" when unknown)."""

    code = 130
    retriable = True
    description = "this node does not lead the partition; ask the metadata for its leader"

    def __init__(
        self,
        message: str | None = None,
        *,
        leader_id: int = -1,
        leader_host: str = "",
        leader_port: int = -1,
    ) -> None:
        super().__init__(message)
        self.leader_id = leader_id
        self.leader_host = leader_host
        self.leader_port = leader_port


class NotCoordinatorError(NotLeaderError):
    """A consumer-group request sent to a node of a cluster that is not the group's
    coordinator: the coordinator is the leader of the partition of ``__consumer_offsets``
    that holds the group (its partition is the CRC-32 of the group id modulo the topic's
    partition count). Nothing was changed. Refresh the metadata of ``__consumer_offsets`` and
    send it to that partition's leader; a subclass of :class:`NotLeaderError`, so a client
    that routes by leaders handles it alike."""

    code = 139
    retriable = True
    description = "this node is not the group's coordinator; ask the metadata of __consumer_offsets"


class NotEnoughReplicasError(TidewireError):
    """An ``acks=all`` produce to a partition whose in-sync replicas are fewer than its
    ``min_insync_replicas``: refused before anything was stored; retry once a replica is back
    in sync."""

    code = 131
    retriable = True
    description = "fewer in-sync replicas than min_insync_replicas; nothing was stored"


class NotEnoughReplicasAfterAppendError(TidewireError):
    """An ``acks=all`` produce whose batch was stored and replicated to every in-sync
    replica, but the ISR had shrunk below ``min_insync_replicas`` by then (Kafka's
    ``NOT_ENOUGH_REPLICAS_AFTER_APPEND``): the batch has fewer copies than asked for. It is
    stored (an idempotent producer's retry is answered with its original offsets; another
    producer's retry stores it again)."""

    code = 135
    retriable = True
    description = (
        "stored, but the in-sync replicas fell below min_insync_replicas before it was replicated"
    )


class FencedLeaderEpochError(TidewireError):
    """A replica fetch that names a leader epoch older than the partition's current one: the
    follower has missed a leadership change and must learn it from the metadata first."""

    code = 132
    retriable = True
    description = "the leader epoch given is older than the partition's current one"


class UnknownLeaderEpochError(TidewireError):
    """A replica fetch that names a leader epoch newer than the one this node knows: this node
    has not yet learned the change the sender has; retry."""

    code = 133
    retriable = True
    description = "the leader epoch given is newer than the one this node knows"


class ReplicaAppendError(TidewireError):
    """Batches copied from a leader that do not continue this replica's log (a base offset
    other than its end, or a leader epoch lower than its last batch's): nothing was stored."""

    code = 134
    description = "copied batches do not continue this replica's log"
