"""Durable queues side by side with RabbitMQ, through the peers harness
(``../shared/bench/peers``): its loops, its RabbitMQ target (a durable classic queue,
persistent messages, publisher confirms), and tidewire's durable queue as the target
``project-queue`` defined here, registered with the harness before it runs.

Usage (from the project's root; the harness's venv holds aio-pika and this checkout)::

    (cd ../shared/bench && bash peers/setup.sh)      # once: the brokers and the venv
    /tmp/peers/venv/bin/pip install -e .             # this checkout, in the harness's venv
    /tmp/peers/venv/bin/python benchmarks/queues_peers.py --peer rabbitmq \\
        --peer project-queue --tests publish,e2e,catchup --sizes 1024 --reps 3 \\
        --modes confirm_sync,confirm_async,consume

Every argument goes to ``python -m peers`` (``--help``); ``PEERS_DIR`` names the harness's
directory if it is not ``../shared/bench`` from the project's root. The harness starts
each broker itself (tidewire: ``peers.servers.ProjectServer``, ``fsync = "always"``).

The modes are named as the RabbitMQ target's, so ``--modes`` selects the same workload on
both:

- ``confirm_sync``: publish one message into the durable queue through the default
  exchange, await its confirm (stored and fsynced), next;
- ``confirm_async``: the same, at most ``window`` (1,000) publishes awaiting their confirm
  at once (the client coalesces concurrent publishes into shared requests);
- ``consume`` (catch-up and end-to-end): an ``AsyncQueueConsumer`` with prefetch 1,000,
  acking every 100 messages with ``ack_many``, at most 4 ack requests under way while it
  takes more (RabbitMQ: prefetch 1,000, ack multiple every 100; an AMQP ack has no answer).

Measured on the 2-core development machine (shared with other work; RabbitMQ 3.10.8 on
Erlang 25, Debian's packages, the harness's settings), medians of 3 reps [min-max]::

    /tmp/peers/venv/bin/python benchmarks/queues_peers.py \
        --peer rabbitmq --peer project-queue --tests publish,e2e,catchup --sizes 1024 \
        --reps 3 -n 20000 --limit 10 --rate 5000 --modes confirm_sync,confirm_async,consume

    1 KB, durable          tidewire                   RabbitMQ                 ratio
    confirm_sync           683 msg/s [637-767]        823 msg/s [784-876]      0.83
    confirm_async          27,534 [24,338-27,837]     3,466 [3,306-3,512]      7.9
      broker CPU/msg       5.5 µs                     182 µs
    e2e unthrottled        21,375 [18,787-21,658]     2,235 [2,216-2,332]      9.6
      p50 / p99            54 / 94 ms                 490 / 699 ms
    e2e paced 5,000/s      4,987 msg/s delivered      2,131 (falls behind)
      p50 / p99            17.9 / 87.6 ms             494 / 671 ms
    catch-up consume+ack   30,759 [30,023-34,088]     6,180 [5,120-6,365]      5.0
    broker peak RSS        66-71 MB                   169-370 MB

RabbitMQ was run with the harness's defaults; on shared CPUs its scheduler busy-waiting
costs it (``PEERS_RABBIT_ERL_ARGS="+sbwt none"`` is the harness's knob for that, not used
here).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

_HERE = Path(__file__).resolve().parent
PEERS_DIR = Path(os.environ.get("PEERS_DIR", _HERE.parent.parent / "shared" / "bench"))
if str(PEERS_DIR) not in sys.path:
    sys.path.insert(0, str(PEERS_DIR))
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

from peers import targets as _targets  # noqa: E402 - the harness's directory, added above
from peers.targets.base import Mode, Target  # noqa: E402
from peers.targets.project import broker_addr  # noqa: E402

QUEUE = "bench.durable"
PREFETCH = 1000
ACK_EVERY = 100
#: Ack requests under way at once (each answered after its fsync).
ACKS_IN_FLIGHT = 4


class ProjectQueueTarget(Target):
    """tidewire's durable queue through ``tidewire.client`` (AsyncClient, AsyncQueueConsumer)."""

    name = "project-queue"
    server = "project"
    publish_modes: ClassVar[list[Mode]] = [
        Mode(
            "confirm_sync",
            "durable-sync",
            "publish -> durable queue (fsync always) via the default exchange, await each "
            "confirm (answered after an fsync covers it)",
        ),
        Mode(
            "confirm_async",
            "durable-batch",
            "same, confirms awaited concurrently, <= window outstanding (the client coalesces "
            "concurrent publishes into shared requests)",
        ),
    ]
    e2e_pairs: ClassVar[list[tuple[str, str]]] = [("confirm_async", "consume")]
    catchup_fill_mode = "confirm_async"
    consume_modes: ClassVar[list[Mode]] = [
        Mode(
            "consume",
            "read",
            f"AsyncQueueConsumer, prefetch {PREFETCH}, ack_many every {ACK_EVERY} msgs, "
            f"<= {ACKS_IN_FLIGHT} ack requests in flight (each answered after its fsync)",
        ),
    ]

    def __init__(self, window: int = 1000, batch: int = 100) -> None:
        super().__init__(window, batch)
        self.addr = broker_addr()
        self.client: Any = None
        self.consumer: Any = None
        self.outstanding: deque[asyncio.Task[Any]] = deque()

    async def connect(self) -> None:
        from tidewire.client import AsyncClient

        self.client = AsyncClient(self.addr)
        await self.client.ping()

    async def close(self) -> None:
        try:
            if self.consumer is not None:
                await self.consumer.close()
        finally:
            await self.client.close()

    async def reset(self, mode: str) -> None:
        from tidewire.errors import UnknownQueueError

        with contextlib.suppress(UnknownQueueError):
            await self.client.delete_queue(QUEUE)
        await self.client.declare_queue(QUEUE, durable=True)

    async def prepare_publisher(self, mode: str) -> None:
        publish = self.client.publish
        out = self.outstanding
        # Warm up before the clock: the default exchange routes this to no queue (there is
        # no queue of that name), so it is dropped, and the publish path is open.
        await publish("", "bench.warm-up", b"")
        if mode == "confirm_sync":

            async def pub(data: bytes) -> None:
                await publish("", QUEUE, data)

        else:
            window = self.window
            create_task = asyncio.get_running_loop().create_task

            async def pub(data: bytes) -> None:
                out.append(create_task(publish("", QUEUE, data)))
                while len(out) >= window:
                    t = out.popleft()
                    await t

        self.publish = pub

    async def flush(self) -> None:
        out = self.outstanding
        while out:
            await out.popleft()

    async def prepare_consumer(self, mode: str) -> None:
        from tidewire.client import AsyncQueueConsumer

        self.consumer = AsyncQueueConsumer(self.addr, QUEUE, prefetch=PREFETCH)
        await self.consumer.__aenter__()

    async def consume(self, n: int, deadline: float, on_msg: Callable[[bytes], None] | None) -> int:
        consumer = self.consumer
        got = 0
        pending: list[Any] = []
        acks: deque[asyncio.Task[None]] = deque()
        create_task = asyncio.get_running_loop().create_task

        async def take() -> None:
            nonlocal got, pending
            async for msg in consumer:
                got += 1
                if on_msg is not None:
                    on_msg(msg.value)
                pending.append(msg)
                if len(pending) >= ACK_EVERY or got >= n:
                    # Not awaited here (an AMQP ack has no answer to wait for): at most
                    # ACKS_IN_FLIGHT requests under way, all answered before consume returns.
                    acks.append(create_task(consumer.ack_many(pending)))
                    pending = []
                    while len(acks) > ACKS_IN_FLIGHT:
                        await acks.popleft()
                if got >= n:
                    return

        with contextlib.suppress(TimeoutError):  # the harness's bound: count what came
            await asyncio.wait_for(take(), max(0.01, deadline - time.perf_counter()))
        while acks:
            await acks.popleft()
        return got

    def settings(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "prefetch": PREFETCH,
            "ack_every": ACK_EVERY,
            "queue": QUEUE,
            "addr": self.addr,
        }


_targets.REGISTRY.setdefault("project-queue", "queues_peers:ProjectQueueTarget")


def main() -> int:
    from peers.__main__ import main as peers_main

    return int(peers_main(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
