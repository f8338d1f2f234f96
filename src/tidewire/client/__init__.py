"""Python clients of the binary protocol.

- :class:`AsyncClient` and its blocking twin :class:`Client`: administration, produce a
  batch, fetch (as records, or as the batches' bytes), offsets, commits from outside a
  group -- one request per call.
- :class:`AsyncProducer` and :class:`Producer`: batching, pipelining, retrying, idempotent
  publishing with a future per message (:class:`RecordFuture`, :class:`BlockingRecordFuture`)
  resolving to :class:`RecordMetadata`.
- :class:`AsyncConsumer` and :class:`Consumer`: read assigned partitions from an offset,
  as :class:`ConsumerRecord` objects, with long-poll and prefetch; ``poll_batch`` hands out
  a :class:`ConsumedBatch` (columns, and a ``pyarrow.RecordBatch`` by ``to_arrow()``).
- :class:`AsyncGroupConsumer` and :class:`GroupConsumer`: members of a consumer group:
  partitions assigned by the broker, committed offsets, seek, pause / resume, callbacks.
- :class:`AsyncSubscriber` and :class:`Subscriber`: push delivery: subscribe once to
  partitions from offsets, the broker sends batches as they are appended, within the credit
  the subscriber grants as records are taken; resumes from its position after a reconnect.
- Queues and exchanges (AMQP-style): :class:`AsyncClient` and :class:`Client` declare,
  bind, publish with confirms (:class:`PublishResult`), take (``get``), settle, browse and
  replay; :class:`AsyncQueueConsumer` and :class:`QueueConsumer` consume a queue with a
  prefetch bound, handing out :class:`QueueMessage` (:class:`BlockingQueueMessage`) to
  ``ack``, ``nack`` or ``reject``; listings as :class:`QueueInfo`, :class:`ExchangeInfo`,
  :class:`BindingInfo`.
- Lightweight streams: ``client.streams`` of :class:`AsyncClient` (:class:`AsyncStreams`)
  and of :class:`Client` (:class:`Streams`): send (:class:`SendItem`, :class:`SendResult`),
  work-queue receive, fan-out read and subscribe by resume token (:data:`FROM_START`,
  :data:`FROM_END`) of :class:`StreamMessage`; :class:`StreamInfo`, :class:`StreamStats`.
- :class:`TlsOptions`: TLS to the broker (CA, client certificate, server name), taken by
  every client as ``tls=`` (``True``: TLS with the system's CAs).
- :class:`Credentials`: an API key (and the SASL mechanism to present it with), taken by
  every client as ``credentials=``: each connection authenticates right after it opens.
- :func:`fnv1a_32`: the key hash that chooses a keyed message's partition.
- :class:`RoutingStats`: what a client's routing did (metadata refreshes, NotLeader retries,
  leader moves followed): ``routing_stats`` of every producer, consumer and subscriber.

Public names::

    AsyncClient, Client, Message, FetchedRecords, FetchedBatches
    AsyncProducer, Producer, RecordMetadata, RecordFuture, BlockingRecordFuture
    AsyncConsumer, Consumer, ConsumerRecord, ConsumedBatch, Gap
    AsyncGroupConsumer, GroupConsumer
    AsyncSubscriber, Subscriber
    AsyncQueueConsumer, QueueConsumer, QueueMessage, BlockingQueueMessage,
    PublishResult, QueueInfo, ExchangeInfo, BindingInfo
    AsyncStreams, Streams, SendItem, SendResult, StreamMessage, StreamInfo, StreamStats,
    FROM_START, FROM_END
    Credentials, TlsOptions
    fnv1a_32, RoutingStats
"""

from __future__ import annotations

from tidewire.client._accumulator import BlockingRecordFuture, RecordFuture, RecordMetadata
from tidewire.client._batch import ConsumedBatch
from tidewire.client._client import (
    AsyncClient,
    AuditEvents,
    Client,
    FetchedBatches,
    FetchedRecords,
    Message,
)
from tidewire.client._consumer import AsyncConsumer, Consumer, ConsumerRecord, Gap
from tidewire.client._group import AsyncGroupConsumer, GroupConsumer
from tidewire.client._producer import AsyncProducer
from tidewire.client._producer_sync import Producer
from tidewire.client._queue_consumer import AsyncQueueConsumer, QueueConsumer
from tidewire.client._queue_messages import BlockingQueueMessage, QueueMessage
from tidewire.client._queues import PublishResult
from tidewire.client._routing import RoutingStats
from tidewire.client._streams import FROM_END, FROM_START, AsyncStreams, Streams
from tidewire.client._subscriber import AsyncSubscriber, Subscriber
from tidewire.client.partitioner import fnv1a_32
from tidewire.protocol.messages import BindingInfo, ExchangeInfo, QueueInfo
from tidewire.protocol.streams import (
    SendItem,
    SendResult,
    StreamInfo,
    StreamMessage,
    StreamStats,
)
from tidewire.security.credentials import Credentials
from tidewire.security.tls import TlsOptions

__all__ = [
    "FROM_END",
    "FROM_START",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncGroupConsumer",
    "AsyncProducer",
    "AsyncQueueConsumer",
    "AsyncStreams",
    "AsyncSubscriber",
    "AuditEvents",
    "BindingInfo",
    "BlockingQueueMessage",
    "BlockingRecordFuture",
    "Client",
    "ConsumedBatch",
    "Consumer",
    "ConsumerRecord",
    "Credentials",
    "ExchangeInfo",
    "FetchedBatches",
    "FetchedRecords",
    "Gap",
    "GroupConsumer",
    "Message",
    "Producer",
    "PublishResult",
    "QueueConsumer",
    "QueueInfo",
    "QueueMessage",
    "RecordFuture",
    "RecordMetadata",
    "RoutingStats",
    "SendItem",
    "SendResult",
    "StreamInfo",
    "StreamMessage",
    "StreamStats",
    "Streams",
    "Subscriber",
    "TlsOptions",
    "fnv1a_32",
]
