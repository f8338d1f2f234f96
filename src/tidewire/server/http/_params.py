"""Query parameters and error answers shared by the streaming endpoints."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from tidewire._tasks import cancel_and_wait
from tidewire.broker import Broker
from tidewire.errors import (
    BackpressureError,
    InvalidRequestError,
    TidewireError,
    UnknownPartitionError,
)
from tidewire.server.http.cluster import topic_partition_count

__all__ = [
    "encoding_param",
    "error_frame",
    "int_param",
    "partitions_param",
    "wait_for_data_or",
]


def error_frame(exc: TidewireError) -> dict[str, Any]:
    """The gateway's error shape as a stream frame: ``{"type": "error", "error": {code, name,
    message}}``."""
    return {
        "type": "error",
        "error": {"code": exc.code, "name": type(exc).__name__, "message": exc.message},
    }


async def wait_for_data_or(
    broker: Broker, keys: Sequence[tuple[str, int]], timeout_s: float, *events: asyncio.Event
) -> None:
    """Wait until one of these partitions is appended to, one of ``events`` is set, or
    ``timeout_s`` passes (a stream that is caught up; the caller reads again afterwards)."""
    if any(e.is_set() for e in events):
        return
    data = asyncio.create_task(broker.wait_for_data(keys, timeout_s))
    others = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait([data, *others], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in others:
            await cancel_and_wait(t)
        if not data.done():
            await cancel_and_wait(data, ignore=(BackpressureError,))
        elif not data.cancelled() and isinstance(data.exception(), BackpressureError):
            await asyncio.sleep(min(timeout_s, 1.0))  # the broker's waiter bound: poll instead


def int_param(params: Any, name: str, default: int, low: int, high: int) -> int:
    text = params.get(name)
    if text is None or text == "":
        return default
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise InvalidRequestError(f"{name}={text!r} must be an integer within {low:,}..{high:,}")
    return int(text)


def encoding_param(params: Any) -> bool:
    enc = params.get("encoding", "auto") or "auto"
    if enc not in ("auto", "base64"):
        raise InvalidRequestError(f"encoding={enc!r} must be auto or base64")
    return enc == "base64"


def partitions_param(broker: Broker, topic: str, text: str | None) -> list[int]:
    n = topic_partition_count(broker, topic)  # a cluster's: also of partitions held elsewhere
    if text is None or text == "":
        return list(range(n))
    out: list[int] = []
    for raw in text.split(","):
        item = raw.strip()
        if not (item.isascii() and item.isdigit()):
            raise InvalidRequestError(f"partitions={text!r}: {item!r} is not a partition number")
        p = int(item)
        if p >= n:
            raise UnknownPartitionError(f"topic {topic!r} has partitions 0..{n - 1}, not {p}")
        if p not in out:
            out.append(p)
    return out
