"""tidewire's errors as Kafka error codes: what a Kafka client is answered when the broker
core raises (:func:`error_code`).

The mapping follows the meaning, not the number: a client decides from Kafka's code whether
to retry (``NOT_ENOUGH_REPLICAS``, ``KAFKA_STORAGE_ERROR`` and ``REQUEST_TIMED_OUT`` are
retriable for every Kafka client), to refresh its metadata (``UNKNOWN_TOPIC_OR_PARTITION``),
or to give up (``CORRUPT_MESSAGE``, ``INVALID_CONFIG``). An error without a mapping answers
``UNKNOWN_SERVER_ERROR``; its message still goes where the API has an error message field.
"""

from __future__ import annotations

from tidewire.errors import (
    AuthenticationFailedError,
    AuthorizationFailedError,
    BackpressureError,
    BatchTooLargeError,
    DuplicateSequenceError,
    FencedLeaderEpochError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InternalTopicError,
    InvalidConfigError,
    InvalidGroupError,
    InvalidMagicError,
    InvalidRequestError,
    InvalidTopicError,
    LogClosedError,
    LogFailedError,
    NotCoordinatorError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    PartitionCorruptError,
    PartitionOfflineError,
    ProducerFencedError,
    RebalanceInProgressError,
    RecordBatchError,
    RequestTimedOutError,
    ShuttingDownError,
    StorageError,
    TidewireError,
    TooManyAuthFailuresError,
    TopicExistsError,
    UnknownGroupError,
    UnknownLeaderEpochError,
    UnknownMemberError,
    UnknownPartitionError,
    UnknownTopicError,
    UnsupportedCompressionError,
    UnsupportedSaslMechanismError,
    UnsupportedVersionError,
)
from tidewire.protocol.kafka import ErrorCode

__all__ = ["error_code"]

#: Most specific first: the first class ``exc`` is an instance of decides.
_CODES: tuple[tuple[type[TidewireError], ErrorCode], ...] = (
    (InvalidMagicError, ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT),
    (UnsupportedCompressionError, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE),
    (RecordBatchError, ErrorCode.CORRUPT_MESSAGE),
    (BatchTooLargeError, ErrorCode.MESSAGE_TOO_LARGE),
    (OffsetOutOfRangeError, ErrorCode.OFFSET_OUT_OF_RANGE),
    # A cluster's answers (retriable in every Kafka client: it refreshes its metadata, or
    # waits for the in-sync replicas to come back, and sends again).
    (NotCoordinatorError, ErrorCode.NOT_COORDINATOR),  # a NotLeaderError: before it
    (NotLeaderError, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (NotEnoughReplicasError, ErrorCode.NOT_ENOUGH_REPLICAS),
    (NotEnoughReplicasAfterAppendError, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND),
    (FencedLeaderEpochError, ErrorCode.FENCED_LEADER_EPOCH),
    (UnknownLeaderEpochError, ErrorCode.UNKNOWN_LEADER_EPOCH),
    (UnknownTopicError, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    (UnknownPartitionError, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    (TopicExistsError, ErrorCode.TOPIC_ALREADY_EXISTS),
    (InternalTopicError, ErrorCode.INVALID_TOPIC_EXCEPTION),
    (InvalidTopicError, ErrorCode.INVALID_TOPIC_EXCEPTION),
    (InvalidConfigError, ErrorCode.INVALID_CONFIG),
    # A partition that cannot be read or written now: Kafka's own answer for a log
    # directory that failed (retriable: the client refreshes metadata and retries).
    (PartitionOfflineError, ErrorCode.KAFKA_STORAGE_ERROR),
    (PartitionCorruptError, ErrorCode.KAFKA_STORAGE_ERROR),
    (LogFailedError, ErrorCode.KAFKA_STORAGE_ERROR),
    (StorageError, ErrorCode.KAFKA_STORAGE_ERROR),
    (LogClosedError, ErrorCode.KAFKA_STORAGE_ERROR),
    (ProducerFencedError, ErrorCode.INVALID_PRODUCER_EPOCH),
    (OutOfOrderSequenceError, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    (DuplicateSequenceError, ErrorCode.DUPLICATE_SEQUENCE_NUMBER),
    (IllegalGenerationError, ErrorCode.ILLEGAL_GENERATION),
    (UnknownMemberError, ErrorCode.UNKNOWN_MEMBER_ID),
    (RebalanceInProgressError, ErrorCode.REBALANCE_IN_PROGRESS),
    (InconsistentGroupProtocolError, ErrorCode.INCONSISTENT_GROUP_PROTOCOL),
    (UnknownGroupError, ErrorCode.GROUP_ID_NOT_FOUND),
    (InvalidGroupError, ErrorCode.INVALID_GROUP_ID),
    (TooManyAuthFailuresError, ErrorCode.SASL_AUTHENTICATION_FAILED),
    (AuthenticationFailedError, ErrorCode.SASL_AUTHENTICATION_FAILED),
    (UnsupportedSaslMechanismError, ErrorCode.UNSUPPORTED_SASL_MECHANISM),
    # Refused as a whole; per-resource denials are answered by the handlers themselves.
    (AuthorizationFailedError, ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
    (UnsupportedVersionError, ErrorCode.UNSUPPORTED_VERSION),
    (InvalidRequestError, ErrorCode.INVALID_REQUEST),
    (RequestTimedOutError, ErrorCode.REQUEST_TIMED_OUT),
    # Retriable in every Kafka client, like tidewire's own: a drain (the client refreshes
    # its metadata and retries), a full waiter list (THROTTLING_QUOTA_EXCEEDED is known to
    # the admin clients only; a timeout is retried by every producer and consumer).
    (ShuttingDownError, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (BackpressureError, ErrorCode.REQUEST_TIMED_OUT),
)


def error_code(exc: TidewireError) -> ErrorCode:
    """The Kafka error code answering ``exc`` (``UNKNOWN_SERVER_ERROR`` when none fits)."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return ErrorCode.UNKNOWN_SERVER_ERROR
