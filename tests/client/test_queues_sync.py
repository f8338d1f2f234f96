"""The blocking twins for queues: :class:`Client`'s queue methods, :class:`QueueConsumer` and
:class:`BlockingQueueMessage`, settled without ``await``. The broker runs on the test's loop;
the blocking calls run in a thread of their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.client._support import PROMPT_S, addr, in_thread, run, serve
from tidewire.client import BlockingQueueMessage, Client, QueueConsumer
from tidewire.errors import UnknownDeliveryTagError, UnknownQueueError


def test_client_and_queue_consumer(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (broker, server):
            at = addr(server)

            def produce() -> list[str]:
                with Client(at) as c:
                    c.declare_exchange("fan", "fanout")
                    info = c.declare_queue("jobs")
                    c.bind("fan", "jobs")
                    c.publish_batch("fan", "", [b"a", b"b", b"c"])
                    got = c.get("jobs")
                    assert [type(m) for m in got] == [BlockingQueueMessage]
                    got[0].nack()  # back to the queue, first
                    with pytest.raises(UnknownQueueError):
                        c.get("missing")
                    return [info.name, *(q.name for q in c.list_queues())]

            assert await in_thread(produce) == ["jobs", "jobs"]

            def consume() -> list[tuple[bytes, int]]:
                out = []
                with QueueConsumer(at, "jobs", prefetch=2) as consumer:
                    for msg in consumer:
                        out.append((msg.value, msg.delivery_count))
                        msg.ack()
                        if len(out) == 3:
                            break
                    with pytest.raises(UnknownDeliveryTagError):
                        msg.ack()
                    assert consumer.get(0.05) is None
                return out

            assert await in_thread(consume) == [(b"a", 2), (b"b", 1), (b"c", 1)]
            assert broker.queues.describe_queue("jobs").counters.acked == 3

            def ack_many() -> list[bytes]:
                with Client(at) as c:
                    c.publish("", "jobs", "text")
                    with QueueConsumer(at, "jobs") as consumer:
                        msg = consumer.get(PROMPT_S)
                        assert msg is not None
                        consumer.ack_many([msg])
                        return [msg.value]

            assert await in_thread(ack_many) == [b"text"]

    run(main())
