"""Queue messages on the command line: ``tidewire consume --queue`` (print each message,
then settle it) and the JSON object every command prints for a queue message.

``consume --queue Q`` takes messages pushed by the broker, at most ``--prefetch`` unsettled
at once (:class:`~tidewire.client.AsyncQueueConsumer`). The messages that have arrived are
written and flushed to stdout, then acknowledged together (one request), so a message is
never acked unprinted: stopping the
command (``--count``, ``--timeout``, Ctrl-C, a crash) leaves the messages it had not yet
acked to the queue, which redelivers them. ``--nack`` requeues each message instead,
``--reject`` dead-letters it.

The JSON object of a message (``--format json`` / ``--json``, ``tidewire dlq list``)::

    {"queue": "q", "offset": 7, "delivery_tag": 12, "delivery_count": 1,
     "redelivered": false, "timestamp": 1714564800000, "routing_key": "k",
     "value": "v", "headers": [{"key": "h", "value": "x"}]}

Values and header values are UTF-8 text, or base64 with ``"value_base64": true`` beside them
when they are not valid UTF-8 (as ``tidewire consume`` prints topic records).
"""

from __future__ import annotations

import asyncio
import base64
import enum
import json
from typing import Any

import typer

from tidewire.broker.queues.model import DEATH_HEADER
from tidewire.client import AsyncClient, AsyncQueueConsumer, QueueMessage

from ._common import cli_credentials, cli_tls

__all__ = ["Settle", "consume_queue", "deaths", "message_doc", "text_or_base64"]

#: Messages the broker pushes before the first is settled, by default: enough to keep the
#: terminal busy, few enough that a stopped command hands little back to the queue.
DEFAULT_PREFETCH = 100


class Settle(enum.StrEnum):
    """What ``consume --queue`` does with each message once printed."""

    ACK = "ack"
    NACK = "nack"  # requeue: it comes back (redelivered first)
    REJECT = "reject"  # dead-letter it (or drop it, without a dead-letter exchange)


def text_or_base64(data: bytes | None) -> tuple[str | None, bool]:
    """(UTF-8 text or base64, whether it is base64); ``(None, False)`` for None."""
    if data is None:
        return None, False
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), True


def deaths(message: QueueMessage) -> list[dict[str, Any]]:
    """The message's ``x-death`` entries, newest first (``[]``: never dead-lettered, or a
    header that is not the broker's JSON list)."""
    for key, value in message.headers:
        if key == DEATH_HEADER and value is not None:
            try:
                doc = json.loads(value)
            except (ValueError, UnicodeDecodeError):
                return []
            if isinstance(doc, list):
                return [d for d in doc if isinstance(d, dict)]
    return []


def message_doc(message: QueueMessage) -> dict[str, object]:
    """The JSON object of one queue message (see the module's docstring)."""
    doc: dict[str, object] = {
        "queue": message.queue,
        "offset": message.offset,
        "delivery_tag": message.delivery_tag,
        "delivery_count": message.delivery_count,
        "redelivered": message.redelivered,
        "timestamp": message.timestamp_ms,
        "routing_key": message.routing_key,
    }
    doc["value"], b64 = text_or_base64(message.value)
    if b64:
        doc["value_base64"] = True
    headers: list[dict[str, object]] = []
    for k, v in message.headers:
        value, b64 = text_or_base64(v)
        h: dict[str, object] = {"key": k, "value": value}
        if b64:
            h["value_base64"] = True
        headers.append(h)
    doc["headers"] = headers
    return doc


def _line(message: QueueMessage, as_json: bool, print_key: bool, separator: bytes) -> bytes:
    if as_json:
        return (
            json.dumps(message_doc(message), ensure_ascii=False, separators=(",", ":")).encode()
            + b"\n"
        )
    line = message.value or b""
    if print_key:
        line = message.routing_key.encode() + separator + line
    return line + b"\n"


async def consume_queue(
    client: AsyncClient,
    addr: str,
    queue: str,
    *,
    prefetch: int,
    count: int | None,
    timeout_s: float | None,
    settle: Settle,
    as_json: bool,
    print_key: bool,
    separator: bytes,
) -> int:
    """Print ``queue``'s messages and settle each after it is printed; return how many.

    ``client`` checks first that the queue exists (an unknown queue is an error at once,
    not a consumer waiting forever); the messages come through a consumer of its own.
    Stops after ``count`` messages, or when ``timeout_s`` passes without one.
    """
    await client.declare_queue(queue, passive=True)
    out = typer.get_binary_stream("stdout")
    printed = 0
    async with AsyncQueueConsumer(
        addr, queue, prefetch=prefetch, tls=cli_tls(), credentials=cli_credentials()
    ) as consumer:
        while count is None or printed < count:
            first = await consumer.get(timeout_s)
            if first is None:
                break  # --timeout seconds without a message
            # What else has arrived already goes with it: printed, flushed, then settled
            # together, one request instead of one round trip (and fsync) per message.
            batch = [first]
            while count is None or printed + len(batch) < count:
                more = await consumer.get(0)
                if more is None:
                    break
                batch.append(more)
            for message in batch:
                out.write(_line(message, as_json, print_key, separator))
            out.flush()  # printed before settled: never acked unseen
            if settle is Settle.ACK:
                await consumer.ack_many(batch)
            elif settle is Settle.NACK:
                await asyncio.gather(*(m.nack(requeue=True) for m in batch))
            else:
                await asyncio.gather(*(m.reject() for m in batch))
            printed += len(batch)
    return printed
