"""Helpers of the stream tests: a broker with streams on a fake clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.broker._support import T0, config
from tidewire.broker import Broker
from tidewire.broker.streams.manager import StreamManager


class FakeClock:
    """Milliseconds since the epoch that move only when told."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@asynccontextmanager
async def streams_broker(
    tmp_path: Path, clock: FakeClock | None = None, **kwargs: Any
) -> AsyncIterator[tuple[Broker, StreamManager]]:
    """A running broker over ``tmp_path`` (its streams on ``clock`` when given)."""
    broker = Broker(config(tmp_path, **kwargs))
    if clock is not None:
        broker.stream_clock = clock
    async with broker:
        yield broker, broker.streams
