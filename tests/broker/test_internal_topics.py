"""Internal topics are the broker's: no client creates, alters, deletes or publishes to
``__consumer_offsets`` (nor creates any other ``__`` name), through the broker core or the
binary protocol; reading stays allowed. A topic of that name made with weaker settings before
this rule (``fsync=never``, a retention) gets the broker's own settings when it starts."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from tests.broker._support import ALL, batch, config, values
from tidewire.broker import Broker
from tidewire.broker.offsets import OFFSETS_PARTITIONS, OFFSETS_TOPIC, internal_config
from tidewire.client import Client, Message
from tidewire.embedded import EmbeddedBroker
from tidewire.errors import InternalTopicError, InvalidTopicError
from tidewire.protocol.messages import TopicConfig
from tidewire.storage import FsyncPolicy, LogConfig, LogManager


def test_clients_cannot_create_internal_or_reserved_topics(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(config(tmp_path)) as b:
            weak = LogConfig(fsync=FsyncPolicy.NEVER)
            with pytest.raises(InternalTopicError, match="internal to the broker") as exc:
                b.create_topic(OFFSETS_TOPIC, 8, weak)
            assert isinstance(exc.value, InvalidTopicError)  # a client may treat it so
            with pytest.raises(InternalTopicError, match="reserved for the broker's internal"):
                b.create_topic("__transaction_state")
            with pytest.raises(InternalTopicError):  # nor by a first publish
                await b.produce("__mine", 0, batch([b"x"]))
            assert b.logs.topics() == {}  # nothing was created
            # The broker creates its own, with its own settings, at the first commit.
            await b.produce("t", 0, batch([b"a"]))
            await b.groups.commit("g", {("t", 0): (1, "")})
            for p in range(OFFSETS_PARTITIONS):
                assert b.logs.get_log(OFFSETS_TOPIC, p).config == internal_config()
            assert b.logs.get_log(OFFSETS_TOPIC, 0).config.fsync is FsyncPolicy.ALWAYS

    asyncio.run(main())


def test_the_binary_protocol_refuses_and_still_reads(tmp_path: Path) -> None:
    with EmbeddedBroker(str(tmp_path / "data")).running() as eb, Client(eb.addr) as client:
        with pytest.raises(InternalTopicError) as refused:
            client.create_topic(OFFSETS_TOPIC, 1, TopicConfig(fsync="never"))
        assert refused.value.code == 90
        assert OFFSETS_TOPIC in refused.value.message
        with pytest.raises(InternalTopicError, match="reserved"):
            client.create_topic("__anything")
        client.produce("t", 0, [Message(b"a")])
        client.commit_offsets("g", {("t", 0): 1})
        with pytest.raises(InternalTopicError):
            client.alter_topic(OFFSETS_TOPIC, config=TopicConfig(fsync="never"))
        with pytest.raises(InternalTopicError):
            client.alter_topic(OFFSETS_TOPIC, partitions=20)
        with pytest.raises(InternalTopicError):
            client.delete_topic(OFFSETS_TOPIC)
        with pytest.raises(InternalTopicError):
            client.produce(OFFSETS_TOPIC, 0, [Message(b"forged commit")])
        assert OFFSETS_TOPIC not in client.list_topics()
        for p in range(OFFSETS_PARTITIONS):
            assert eb.broker.log(OFFSETS_TOPIC, p).config == internal_config()
        # Reading is allowed: the commit is there, as the broker wrote it.
        fetched = [client.fetch(OFFSETS_TOPIC, p, 0).records for p in range(OFFSETS_PARTITIONS)]
        assert sum(len(r) for r in fetched) == 1
        assert client.committed_offsets("g")[("t", 0)] == 1


def test_a_weak_offsets_topic_from_before_gets_the_brokers_settings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As an older version let a client do: ``__consumer_offsets`` created before the first
    commit, with 3 partitions, ``fsync=never`` and a retention of one second."""
    cfg = config(tmp_path)
    old = LogManager(cfg.data_dir).open()
    weak = LogConfig(fsync=FsyncPolicy.NEVER, retention_ms=1000, segment_bytes=1 << 20)
    for p in range(3):
        old.create_log(OFFSETS_TOPIC, p, weak)
    old.close()

    async def main() -> None:
        async with Broker(cfg) as b:
            for p in range(3):
                assert b.logs.get_log(OFFSETS_TOPIC, p).config == internal_config()
            await b.produce("t", 0, batch([b"a", b"b"]))
            await b.groups.commit("g", {("t", 0): (2, "")})  # creates the missing partitions
            for p in range(OFFSETS_PARTITIONS):
                assert b.logs.get_log(OFFSETS_TOPIC, p).config == internal_config()
        async with Broker(cfg) as b:  # persisted, and the commit kept
            assert b.logs.get_log(OFFSETS_TOPIC, 0).config == internal_config()
            assert b.groups.committed("g")[("t", 0)].offset == 2

    with caplog.at_level(logging.WARNING, logger="tidewire.broker"):
        asyncio.run(main())
    warned = [r.getMessage() for r in caplog.records if "fsync=always" in r.getMessage()]
    assert len(warned) == 3, warned  # once per weak partition, at the first start only
    assert "fsync=never" in warned[0]
    assert "retention_ms=1000" in warned[0]


def test_a_reserved_name_made_before_stays_usable(tmp_path: Path) -> None:
    """A ``__`` topic that is not the broker's, created before the rule: kept as it was."""
    cfg = config(tmp_path)
    old = LogManager(cfg.data_dir).open()
    old.create_log("__legacy", 0)
    old.close()

    async def main() -> None:
        async with Broker(cfg) as b:
            assert b.topics() == {"__legacy": 1}
            await b.produce("__legacy", 0, batch([b"x"]))
            assert values(b.read_partition("__legacy", 0, 0, ALL).data) == [(0, b"x")]
            b.alter_topic("__legacy", partitions=2)
            b.delete_topic("__legacy")
            assert b.topics() == {}

    asyncio.run(main())
