"""The clients' public surface: the names ``tidewire.client`` exports, and the twin rule --
:class:`Client` has every public method of :class:`AsyncClient`, with the same signature,
called without ``await``."""

from __future__ import annotations

import inspect
import threading

import pytest

import tidewire.client
from tidewire.client import (
    AsyncClient,
    AsyncQueueConsumer,
    BlockingQueueMessage,
    Client,
    FetchedRecords,
    Message,
    QueueConsumer,
    QueueMessage,
)
from tidewire.client import _client as impl


def public_methods(cls: type) -> dict[str, object]:
    return {
        name: member
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_exported_names() -> None:
    assert tidewire.client.__all__ == [
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
    for name in ("AsyncClient", "Client", "FetchedBatches", "FetchedRecords", "Message"):
        assert getattr(tidewire.client, name) is getattr(impl, name)
    assert (AsyncClient, Client, FetchedRecords, Message) == (
        impl.AsyncClient,
        impl.Client,
        impl.FetchedRecords,
        impl.Message,
    )


def test_async_client_methods() -> None:
    assert sorted(public_methods(AsyncClient)) == [
        "add_acls",
        "alter_acls",
        "alter_principal",
        "alter_replication",
        "alter_topic",
        "bind",
        "browse",
        "clear_quota",
        "close",
        "commit_offsets",
        "committed_offsets",
        "create_api_key",
        "create_principal",
        "create_topic",
        "declare_exchange",
        "declare_queue",
        "delete_exchange",
        "delete_group",
        "delete_principal",
        "delete_queue",
        "delete_topic",
        "describe_acls",
        "describe_audit",
        "describe_group",
        "describe_principals",
        "describe_quotas",
        "describe_topic",
        "fetch",
        "fetch_batches",
        "get",
        "group_lag",
        "list_exchanges",
        "list_groups",
        "list_offset",
        "list_queues",
        "list_topics",
        "ping",
        "produce",
        "produce_batch",
        "producer_state",
        "publish",
        "publish_batch",
        "purge_queue",
        "release_writers",
        "remove_acls",
        "repair_topic",
        "replay",
        "reset_group_offsets",
        "revoke_api_key",
        "server_version",
        "set_quota",
        "settle",
        "storage_problems",
        "unbind",
        "whoami",
    ]
    for name, method in public_methods(AsyncClient).items():
        assert inspect.iscoroutinefunction(method), name


def test_client_is_the_blocking_twin() -> None:
    async_methods = public_methods(AsyncClient)
    sync_methods = public_methods(Client)
    assert sorted(sync_methods) == sorted(async_methods)
    for name, method in sync_methods.items():
        assert not inspect.iscoroutinefunction(method), name
        expected = inspect.signature(async_methods[name])  # type: ignore[arg-type]
        if expected.return_annotation == "list[QueueMessage]":
            # The twin's messages are settled without await.
            expected = expected.replace(return_annotation="list[BlockingQueueMessage]")
        assert inspect.signature(method) == expected, name
    assert inspect.iscoroutinefunction(AsyncClient.__aenter__)
    assert inspect.iscoroutinefunction(AsyncClient.__aexit__)
    assert not inspect.iscoroutinefunction(Client.__enter__)
    assert not inspect.iscoroutinefunction(Client.__exit__)


def test_queue_consumer_is_the_blocking_twin() -> None:
    assert inspect.signature(QueueConsumer.__init__) == inspect.signature(
        AsyncQueueConsumer.__init__
    )
    assert list(inspect.signature(AsyncQueueConsumer.__init__).parameters)[1:3] == [
        "addr",
        "queue",
    ]
    for name in ("get", "ack_many", "close", "start"):
        assert inspect.iscoroutinefunction(getattr(AsyncQueueConsumer, name)), name
        assert not inspect.iscoroutinefunction(getattr(QueueConsumer, name)), name
    for name in ("ack", "nack", "reject"):
        assert inspect.iscoroutinefunction(getattr(QueueMessage, name)), name
        assert not inspect.iscoroutinefunction(getattr(BlockingQueueMessage, name)), name
        assert inspect.signature(getattr(QueueMessage, name)) == inspect.signature(
            getattr(BlockingQueueMessage, name)
        )


def test_client_takes_the_same_settings() -> None:
    assert inspect.signature(Client.__init__) == inspect.signature(AsyncClient.__init__)


def test_a_refused_client_leaves_no_thread() -> None:
    before = set(threading.enumerate())
    with pytest.raises(ValueError, match="HOST:PORT"):
        Client("nonsense")
    leaked = [t for t in threading.enumerate() if t not in before]
    try:
        assert leaked == []
    finally:
        for thread in leaked:  # stop and close the loop the bug left running
            loop = thread._target.__self__  # type: ignore[attr-defined]
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


def test_the_blocking_streams_have_every_method_of_the_async_ones() -> None:
    from tidewire.client import AsyncStreams, Streams

    async_methods = public_methods(AsyncStreams)
    blocking = public_methods(Streams)
    assert (
        sorted(async_methods)
        == sorted(blocking)
        == [
            "describe",
            "list",
            "read",
            "receive",
            "receive_many",
            "send",
            "send_many",
            "stats",
            "subscribe",
        ]
    )
    for name, method in async_methods.items():
        a = inspect.signature(method)  # type: ignore[arg-type]
        b = inspect.signature(blocking[name])  # type: ignore[arg-type]
        assert list(a.parameters) == list(b.parameters), name
        assert [p.default for p in a.parameters.values()] == [
            p.default for p in b.parameters.values()
        ], name
