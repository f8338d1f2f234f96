"""The WAL-backed embeddable broker of the DEV article (seed 002): its Broker, Publish,
Subscribe, drops and metrics, written as docs/migrating.md translates them, against an
embedded tidewire broker: replay after a restart, the unknown-topic and buffer-full errors, a
durable subscriber resuming at its offset, drops counted, counters readable."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.migrating._support import code_blocks, section
from tidewire.client import AsyncGroupConsumer, AsyncProducer, AsyncSubscriber, ConsumerRecord
from tidewire.embedded import EmbeddedBroker
from tidewire.errors import BufferFullError, UnknownTopicError
from tidewire.storage import FsyncPolicy, LogConfig

#: The bound on anything that should happen at once (s), generous for a loaded machine.
PROMPT_S = 30.0

SEED = section("## From the WAL-backed embeddable broker (002)")


def _broker(wal_dir: Path) -> EmbeddedBroker:
    """``NewBroker(BrokerConfig{WALDir})`` as the page writes it."""
    return EmbeddedBroker(
        str(wal_dir),
        auto_create_topics=False,
        log=LogConfig(fsync=FsyncPolicy.ALWAYS),
    )


def test_the_page_writes_the_broker_as_this_test_does() -> None:
    (block,) = code_blocks(section("### The broker, and the WAL"), "python")
    for line in (
        '"./wal",',
        "auto_create_topics=False,",
        "log=LogConfig(fsync=FsyncPolicy.ALWAYS),",
        'await client.create_topic("trades", 4)',
    ):
        assert line in block


async def _take(
    reader: AsyncGroupConsumer | AsyncSubscriber, n: int, timeout_s: float = PROMPT_S
) -> list[ConsumerRecord]:
    got: list[ConsumerRecord] = []
    async with asyncio.timeout(timeout_s):
        while len(got) < n:
            got += await reader.poll(timeout_s, max_records=n - len(got))
    return got


def test_publish_then_replay_after_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        async with _broker(tmp_path / "wal") as eb:
            async with eb.client() as client:
                await client.create_topic("trades", 4)
            async with AsyncProducer(eb.addr) as producer:
                metas = [
                    await (await producer.send("trades", b"m%d" % i, partition=0)) for i in range(3)
                ]
            assert [(m.partition, m.offset) for m in metas] == [(0, 0), (0, 1), (0, 2)]
        async with _broker(tmp_path / "wal") as eb:  # the WAL is replayed
            async with eb.client() as client:
                got = await client.fetch("trades", 0, 0)
                assert [r.value for r in got.records] == [b"m0", b"m1", b"m2"]
            async with AsyncProducer(eb.addr) as producer:
                meta = await (await producer.send("trades", b"m3", partition=0))
            assert meta.offset == 3  # ids go on from where they were

    asyncio.run(main())


class _Stall:
    """A TCP relay to the broker that stops passing the broker's answers on when told: a
    broker that does not keep up, seen from the producer."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.stalled = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        await self.cut()

    async def cut(self) -> None:
        """Close the relay and its connections (the producer sees them lost)."""
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for w in self.writers:
            w.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_w]

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, answers: bool) -> None:
            while data := await r.read(65536):
                if answers and self.stalled.is_set():
                    await asyncio.Event().wait()  # hold the answers back for good
                w.write(data)
                await w.drain()

        loop = asyncio.get_running_loop()
        for task in (
            loop.create_task(pipe(reader, up_w, answers=False)),
            loop.create_task(pipe(up_r, writer, answers=True)),
        ):
            self.tasks.add(task)


async def _send_4k_messages(producer: AsyncProducer, sent: list[int]) -> None:
    """Send 1,000 messages of 4 KiB, appending to ``sent`` as each is taken."""
    for i in range(1000):
        await producer.send("trades", b"x" * 4096, partition=0)
        sent.append(i)


def test_publish_to_an_unknown_topic_and_a_full_buffer_fail_clearly(tmp_path: Path) -> None:
    (block,) = code_blocks(section("### Publish, and backpressure"), "python")
    assert "AsyncProducer(eb.addr, buffer_bytes=1024 * 1024, max_block_ms=250)" in block

    async def main() -> None:
        async with _broker(tmp_path / "wal") as eb:
            async with eb.client() as client:
                await client.create_topic("trades", 4)
            async with AsyncProducer(eb.addr, buffer_bytes=1024 * 1024, max_block_ms=250) as p:
                with pytest.raises(UnknownTopicError, match="'nope' does not exist"):
                    await p.send("nope", b"x")
            stall = _Stall(eb.addr)
            async with (
                stall as addr,
                AsyncProducer(addr, buffer_bytes=1024 * 1024, max_block_ms=250) as producer,
            ):
                meta = await (await producer.send("trades", b"first", partition=0))
                assert meta.offset == 0
                stall.stalled.set()  # from now on the broker seems not to keep up
                sent: list[int] = []
                with pytest.raises(BufferFullError) as info:
                    await _send_4k_messages(producer, sent)
                assert "buffer_bytes=1,048,576 stayed full for max_block_ms=250" in str(info.value)
                assert 200 < len(sent) < 256  # about 1 MiB of 4 KiB messages was taken
                await stall.cut()
                await producer.close(flush=False)

    asyncio.run(main())


def test_a_durable_subscriber_resumes_at_its_offset(tmp_path: Path) -> None:
    async def main() -> None:
        async with _broker(tmp_path / "wal") as eb:
            async with eb.client() as client:
                await client.create_topic("trades", 4)
            async with (
                AsyncGroupConsumer(eb.addr, "sub-1", topics=["trades"]) as sub,
                AsyncProducer(eb.addr) as producer,
            ):
                assert await sub.poll(0.2) == []  # joined: a new subscriber starts from now
                for i in range(5):
                    await producer.send("trades", b"a%d" % i, key=b"k%d" % i)
                await producer.flush()
                got = await _take(sub, 5)
                assert sorted(r.value or b"" for r in got) == [b"a0", b"a1", b"a2", b"a3", b"a4"]
            # closed: its offsets are committed. More arrive while it is away:
            async with AsyncProducer(eb.addr) as producer:
                for i in range(3):
                    await producer.send("trades", b"b%d" % i, key=b"k%d" % i)
        async with _broker(tmp_path / "wal") as eb:  # and the broker restarts
            async with AsyncGroupConsumer(eb.addr, "sub-1", topics=["trades"]) as sub:
                got = await _take(sub, 3)
                assert sorted(r.value or b"" for r in got) == [b"b0", b"b1", b"b2"]
                assert await sub.poll(0.5) == []
            # A non-durable subscriber starts from now.
            async with AsyncSubscriber(eb.addr) as transient, AsyncProducer(eb.addr) as producer:
                await transient.subscribe([("trades", p, "latest") for p in range(4)])
                meta = await (await producer.send("trades", b"c0", partition=2))
                (rec,) = await _take(transient, 1)
                assert (rec.partition, rec.offset, rec.value) == (2, meta.offset, b"c0")

    asyncio.run(main())


def test_a_slow_subscriber_lags_or_with_best_effort_drops_and_counts(tmp_path: Path) -> None:
    async def main() -> None:
        async with _broker(tmp_path / "wal") as eb:
            async with eb.client() as client:
                await client.create_topic("ticks", 1)
            async with AsyncProducer(eb.addr) as producer:
                for i in range(10):
                    await producer.send("ticks", b"t%d" % i)
            # Not best effort: nothing is lost, the subscriber reads all of it late.
            async with AsyncSubscriber(eb.addr) as sub:
                await sub.subscribe([("ticks", 0, "earliest")])
                assert [r.value for r in await _take(sub, 10)] == [b"t%d" % i for i in range(10)]
                assert sub.dropped() == 0
            # Best effort, lagging more than max_lag_bytes=0: skipped ahead, counted.
            async with AsyncSubscriber(eb.addr, best_effort=True, max_lag_bytes=0) as sub:
                await sub.subscribe([("ticks", 0, "earliest")])
                async with asyncio.timeout(PROMPT_S):
                    while sub.dropped() < 10:
                        assert await sub.poll(0.05) == []
                assert sub.dropped() == 10
            assert eb.stats().dropped == 10

    asyncio.run(main())


def test_published_delivered_dropped_counters(tmp_path: Path) -> None:
    async def main() -> None:
        async with _broker(tmp_path / "wal") as eb:
            assert (eb.stats().published, eb.stats().delivered, eb.stats().dropped) == (0, 0, 0)
            async with eb.client() as client:
                await client.create_topic("trades", 2)
            async with AsyncProducer(eb.addr) as producer:
                for i in range(6):
                    await producer.send("trades", b"m%d" % i, partition=i % 2)
            assert eb.stats().published == 6
            async with eb.client() as client:  # one reader by fetch: 3 of partition 0
                got = await client.fetch("trades", 0, 0)
                assert len(got.records) == 3
            assert eb.stats().delivered == 3
            async with AsyncSubscriber(eb.addr) as sub:  # another by push: all 6
                await sub.subscribe([("trades", 0, "earliest"), ("trades", 1, "earliest")])
                assert len(await _take(sub, 6)) == 6
            stats = eb.stats()
            assert (stats.published, stats.delivered, stats.dropped) == (6, 9, 0)
            stats.published = 0  # a copy: the broker's counters stay
            assert eb.stats().published == 6
        async with _broker(tmp_path / "wal") as eb:  # counted since the start
            assert eb.stats().published == 0

    asyncio.run(main())
