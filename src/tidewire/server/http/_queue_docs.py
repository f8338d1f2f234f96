"""Queues, exchanges, bindings and delivered messages as the JSON documents of the HTTP
API (queue_models.py describes them), shared by the routes and the WebSocket subscription."""

from __future__ import annotations

import base64
from typing import Any

from tidewire.broker.queues.model import (
    DEFAULT_EXCHANGE,
    Binding,
    Delivery,
    DeliveryEntry,
    ExchangeSpec,
    QueueStatus,
)
from tidewire.records import iter_batches, read_records
from tidewire.server.http.reading import StoredRecord

__all__ = [
    "DEFAULT_EXCHANGE_PATH",
    "binding_doc",
    "browsed_doc",
    "delivered",
    "exchange_doc",
    "exchange_name",
    "message_doc",
    "queue_doc",
]

#: How a path (or a body's exchange field) names the default exchange ``""``.
DEFAULT_EXCHANGE_PATH = "amq.default"


def exchange_name(raw: str) -> str:
    """The exchange a path or body names: ``amq.default`` is the default exchange ``""``."""
    return DEFAULT_EXCHANGE if raw == DEFAULT_EXCHANGE_PATH else raw


def exchange_doc(spec: ExchangeSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "type": spec.type,
        "durable": spec.durable,
        "alternate_exchange": spec.alternate_exchange,
    }


def binding_doc(b: Binding) -> dict[str, Any]:
    """A binding's document (Binding), whose fields are also those of the binary
    protocol's bind and unbind of it."""
    return {
        "exchange": b.exchange,
        "destination": b.destination,
        "destination_kind": b.destination_kind,
        "key": b.key,
        "arguments": dict(b.arguments),
    }


def queue_doc(s: QueueStatus) -> dict[str, Any]:
    """A queue's settings, messages now, consumers and counters (QueueInfo)."""
    spec, c = s.spec, s.counters
    return {
        "name": spec.name,
        "durable": spec.durable,
        "exclusive": spec.exclusive,
        "auto_delete": spec.auto_delete,
        "max_deliveries": spec.max_deliveries,
        "message_ttl_ms": spec.message_ttl_ms,
        "max_length": spec.max_length,
        "max_length_bytes": spec.max_length_bytes,
        "overflow": spec.overflow,
        "dead_letter_exchange": spec.dead_letter_exchange,
        "dead_letter_routing_key": spec.dead_letter_routing_key,
        "visibility_timeout_ms": spec.visibility_timeout_ms,
        "ready": s.ready,
        "unacked": s.unacked,
        "delayed": s.delayed,
        "bytes": s.bytes,
        "consumers": s.consumers,
        "counters": {
            "published": c.published,
            "delivered": c.delivered,
            "acked": c.acked,
            "redelivered": c.redelivered,
            "dead_lettered": c.dead_lettered,
            "expired": c.expired,
            "dropped": c.dropped,
            "rejected_publishes": c.rejected_publishes,
        },
    }


def delivered(d: Delivery) -> list[tuple[DeliveryEntry, StoredRecord]]:
    """The records of a delivery with their entries, in the entries' order (records of its
    batches without an entry are not part of it and are left out).

    Raises:
        RecordBatchError: a batch that does not decode (the log checked it on append).
    """
    if not d.entries:
        return []
    wanted = {e.offset: e for e in d.entries}
    low = min(wanted)
    found: dict[int, StoredRecord] = {}
    data = d.data
    for start, h in iter_batches(data, verify=False):
        if h.last_offset < low:
            continue
        for rec in read_records(data, start, h, StoredRecord, d.queue, 0, low):
            if rec.offset in wanted:
                found[rec.offset] = rec
    return [(e, found[e.offset]) for e in d.entries if e.offset in found]


def _payload(rec: StoredRecord, force_base64: bool) -> dict[str, Any]:
    """Routing key, value, headers and their encoding: UTF-8 text when every one is valid
    UTF-8 (and base64 was not asked for), else all base64."""
    if not force_base64:
        try:
            return {
                "routing_key": None if rec.key is None else rec.key.decode(),
                "value": None if rec.value is None else rec.value.decode(),
                "headers": {k: None if v is None else v.decode() for k, v in rec.headers},
                "encoding": "utf-8",
            }
        except UnicodeDecodeError:
            pass

    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode("ascii")

    return {
        "routing_key": b64(rec.key),
        "value": b64(rec.value),
        "headers": {k: b64(v) for k, v in rec.headers},
        "encoding": "base64",
    }


def message_doc(entry: DeliveryEntry, rec: StoredRecord, force_base64: bool) -> dict[str, Any]:
    """A delivered message (QueueMessage)."""
    return {
        "tag": entry.tag,
        "offset": entry.offset,
        "delivery_count": entry.delivery_count,
        "redelivered": entry.delivery_count > 1,
        "timestamp": rec.timestamp,
        **_payload(rec, force_base64),
    }


def browsed_doc(rec: StoredRecord, force_base64: bool) -> dict[str, Any]:
    """A message looked at, not delivered (BrowsedMessage)."""
    return {"offset": rec.offset, "timestamp": rec.timestamp, **_payload(rec, force_base64)}
