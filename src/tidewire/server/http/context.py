"""What the native API's routes share: the broker, the settings, the drain signal."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidewire.broker import Broker
from tidewire.server.http.config import HttpConfig

if TYPE_CHECKING:
    from tidewire.server.http.publisher import Publisher

__all__ = ["GatewayContext"]


@dataclass(slots=True)
class GatewayContext:
    """The state of one native API app.

    Attributes:
        broker: the broker core the routes call (same event loop).
        config: the gateway's settings.
        closing: set when the gateway drains: long-polls return at once with what they have,
            and ``/healthz/ready`` answers 503.
        publisher: stores messages (with their idempotency keys) for every publish route.
        on_topic_deleted: called with a topic's name after the API deleted it (routers that
            keep state per topic forget it).
    """

    broker: Broker
    config: HttpConfig
    closing: asyncio.Event
    publisher: Publisher
    on_topic_deleted: list[Callable[[str], None]] = field(default_factory=list)
