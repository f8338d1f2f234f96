"""End to end against a real ``tidewire serve`` process on a free port: publish and consume
through both Python clients (asyncio and blocking) and the CLI, in every combination; keyed
messages keep their order and land on the key's partition; a long-poll returns as soon as data
arrives; bad input gets its specific error and leaves what was stored alone.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli._support import run_cli, serving
from tidewire.client import (
    AsyncConsumer,
    AsyncProducer,
    Client,
    Consumer,
    Producer,
    fnv1a_32,
)
from tidewire.errors import (
    BatchTooLargeError,
    InvalidTopicError,
    UnknownPartitionError,
    UnknownTopicError,
)
from tidewire.protocol.messages import TopicConfig

PARTITIONS = 4
KEYS = [b"user-%d" % i for i in range(10)]
PER_KEY = 50
#: Generous bound on what should happen at once on a loaded machine (s).
PROMPT_S = 10.0


@pytest.fixture(scope="module")
def addr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("e2e") / "data"
    with serving(data, "--partitions", str(PARTITIONS), "--fsync", "always") as (_, port):
        yield f"127.0.0.1:{port}"


def _keyed_messages(tag: str) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` interleaved across keys; each key's values numbered in order."""
    return [(k, b"%s:%s:%d" % (tag.encode(), k, i)) for i in range(PER_KEY) for k in KEYS]


def _check_keyed(tag: str, records: list[tuple[int, int, bytes | None, bytes | None]]) -> None:
    """Every message of ``tag`` read once, on its key's partition, in the order sent."""
    by_key: dict[bytes, list[bytes]] = defaultdict(list)
    for partition, _, key, value in sorted(records, key=lambda r: (r[0], r[1])):
        assert key is not None
        assert value is not None
        if not value.startswith(tag.encode() + b":"):
            continue
        assert partition == fnv1a_32(key) % PARTITIONS, (key, partition)
        by_key[key].append(value)
    assert by_key == {k: [b"%s:%s:%d" % (tag.encode(), k, i) for i in range(PER_KEY)] for k in KEYS}


def _read_sync(addr: str, topic: str, n: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
    out: list[tuple[int, int, bytes | None, bytes | None]] = []
    with Consumer(addr, max_wait_ms=200) as consumer:
        consumer.assign([(topic, p, "earliest") for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        while len(out) < n and time.monotonic() < deadline:
            out += [(r.partition, r.offset, r.key, r.value) for r in consumer.poll(1.0)]
    return out


async def _read_async(
    addr: str, topic: str, n: int
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    out: list[tuple[int, int, bytes | None, bytes | None]] = []
    async with AsyncConsumer(addr, max_wait_ms=200) as consumer:
        await consumer.assign([(topic, p, "earliest") for p in range(PARTITIONS)])
        async with asyncio.timeout(60):
            async for r in consumer:
                out.append((r.partition, r.offset, r.key, r.value))
                if len(out) == n:
                    break
    return out


@pytest.mark.parametrize("writer", ["async", "sync"])
@pytest.mark.parametrize("reader", ["async", "sync"])
def test_keyed_messages_through_both_clients(addr: str, writer: str, reader: str) -> None:
    topic = f"keyed-{writer}-{reader}"
    msgs = _keyed_messages(topic)
    if writer == "sync":
        with Producer(addr, linger_ms=2) as producer:
            futs = [producer.send(topic, v, key=k) for k, v in msgs]
            metas = [f.result(30) for f in futs]
    else:

        async def produce() -> list[object]:
            async with AsyncProducer(addr, linger_ms=2) as producer:
                futs = [await producer.send(topic, v, key=k) for k, v in msgs]
                return [await f for f in futs]

        metas = asyncio.run(produce())
    for (key, _), meta in zip(msgs, metas, strict=True):
        assert meta.partition == fnv1a_32(key) % PARTITIONS  # type: ignore[attr-defined]
    read = _read_sync(addr, topic, len(msgs)) if reader == "sync" else None
    if read is None:
        read = asyncio.run(_read_async(addr, topic, len(msgs)))
    assert len(read) == len(msgs)
    _check_keyed(topic, read)
    # The offsets the futures gave are where the records are.
    where = {(p, o): v for p, o, _, v in read}
    for (_, value), meta in zip(msgs, metas, strict=True):
        assert where[(meta.partition, meta.offset)] == value  # type: ignore[attr-defined]


def test_cli_to_python_and_python_to_cli(addr: str) -> None:
    lines = "".join(f"{k.decode()}\tcli-{i}\n" for i, k in enumerate(KEYS))
    pub = run_cli(
        ["publish", "cli-in", "-", "--key-separator", "\t", "--addr", addr, "--json"], input=lines
    )
    assert pub.exit_code == 0, pub.stderr
    read = _read_sync(addr, "cli-in", len(KEYS))
    assert sorted(v for _, _, _, v in read if v is not None) == sorted(
        b"cli-%d" % i for i in range(len(KEYS))
    )
    for partition, _, key, _ in read:
        assert key is not None
        assert partition == fnv1a_32(key) % PARTITIONS

    with Producer(addr) as producer:
        for i in range(5):
            producer.send("py-out", b'{"n": %d}' % i, key=b"k", headers=[("h", b"v")])
        producer.flush()
    out = run_cli(
        [
            *("consume", "py-out", "--from-beginning", "--count", "5", "--format", "json"),
            *("--addr", addr, "--timeout", "30"),
        ]
    )
    assert out.exit_code == 0, out.stderr
    docs = [json.loads(line) for line in out.stdout.splitlines()]
    assert [d["value"] for d in docs] == [f'{{"n": {i}}}' for i in range(5)]
    assert {d["key"] for d in docs} == {"k"}
    assert {d["partition"] for d in docs} == {fnv1a_32(b"k") % PARTITIONS}
    assert [d["offset"] for d in docs] == list(range(5))


def test_long_poll_returns_when_data_arrives(addr: str) -> None:
    with Client(addr) as admin:
        admin.create_topic("wake", partitions=1)
    got: list[float] = []

    def wait_for_one() -> None:
        with Consumer(addr, max_wait_ms=30_000) as consumer:
            consumer.assign([("wake", 0, "latest")])
            records = consumer.poll(60)
            got.append(time.monotonic())
            assert [r.value for r in records] == [b"now"]

    reader = threading.Thread(target=wait_for_one)
    reader.start()
    time.sleep(0.5)  # the consumer is waiting on the broker by now (max_wait 30 s)
    with Producer(addr, linger_ms=0) as producer:
        producer.send("wake", b"now").result(30)
        sent = time.monotonic()
    reader.join(60)
    assert got, "the consumer did not return"
    # Well before the 30 s long-poll would have ended on its own.
    assert got[0] - sent < PROMPT_S


def test_bad_input_gets_its_specific_error(addr: str, tmp_path: Path) -> None:
    with Client(addr) as admin:
        admin.create_topic("small", partitions=2, config=TopicConfig(max_message_bytes=4096))
        with Producer(addr) as producer:
            ok = producer.send("small", b"fits").result(30)
            with pytest.raises(BatchTooLargeError):
                producer.send("small", b"x" * 10_000)
            with pytest.raises(UnknownPartitionError):
                producer.send("small", b"v", partition=7).result(30)
            with pytest.raises(TypeError):
                producer.send("small", "not bytes")  # type: ignore[arg-type]
            with pytest.raises(InvalidTopicError):
                producer.send("bad topic name!", b"v").result(30)
        with pytest.raises(UnknownTopicError):
            admin.describe_topic("never-created")
        # Nothing acknowledged was lost or changed by the refusals.
        parts = admin.describe_topic("small").partitions
        assert sum(p.log_end_offset for p in parts) == 1
        got = admin.fetch("small", ok.partition, ok.offset)
        assert [r.value for r in got.records] == [b"fits"]

    # A broker that does not create topics on first publish refuses an unknown topic.
    with (
        serving(tmp_path / "strict", "--no-auto-create") as (_, port),
        Producer(f"127.0.0.1:{port}", max_block_ms=5_000) as producer,
        pytest.raises(UnknownTopicError),
    ):
        producer.send("nope", b"v").result(30)
