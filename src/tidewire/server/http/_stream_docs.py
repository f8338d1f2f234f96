"""JSON documents of ``/v1/streams``: requests to :class:`SendItem`, and messages, results
and descriptions to the documents of ``streams_models.py`` (built as plain dicts: the answers
of long-polls are encoded by msgspec, without a pydantic object per message)."""

from __future__ import annotations

import base64
import binascii
import contextlib
from typing import Any

import msgspec

from tidewire.broker.streams.model import (
    SendItem,
    SendResult,
    StreamInfo,
    StreamMessage,
    StreamStats,
)
from tidewire.errors import InvalidRequestError, for_code
from tidewire.server.http.streams_models import StreamSendItem, StreamSendRequest

__all__ = ["DUPLICATE", "info_doc", "message_doc", "result_doc", "send_item", "stats_doc"]

_json = msgspec.json.Encoder().encode
#: SendResult.code of a message whose uuid was sent before (nothing stored).
DUPLICATE = -1


def send_item(stream: str, m: StreamSendItem | StreamSendRequest, where: str) -> SendItem:
    """The :class:`SendItem` of a request's message (``where``: its place, for errors).

    Raises:
        InvalidRequestError: ``value_base64`` that is not base64.
    """
    if m.value is not None:
        value = m.value.encode("utf-8", "surrogatepass")
    elif m.value_base64 is not None:
        try:
            value = base64.b64decode(m.value_base64, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequestError(f"field {where}value_base64: not valid base64") from None
    else:
        value = _json(m.json_)
    return SendItem(stream, value, m.uuid, m.ttl_ms, m.persistent)


def result_doc(r: SendResult) -> dict[str, Any]:
    """A :class:`StreamSendResult` document."""
    if r.code == 0:
        return {"status": "stored", "token": r.token}
    if r.code == DUPLICATE:
        return {"status": "duplicate", "token": ""}
    name = for_code(r.code).__name__
    return {
        "status": "error",
        "token": "",
        "error": {"code": r.code, "name": name, "message": r.message},
    }


def message_doc(m: StreamMessage, force_base64: bool) -> dict[str, Any]:
    """A :class:`StreamMessageDoc` document."""
    value: str | None = None
    if not force_base64:
        with contextlib.suppress(UnicodeDecodeError):  # not text: base64
            value = m.value.decode()
    return {
        "stream": m.stream,
        "value": value if value is not None else base64.b64encode(m.value).decode("ascii"),
        "encoding": "utf-8" if value is not None else "base64",
        "uuid": m.uuid,
        "timestamp_ms": m.timestamp_ms,
        "expires_at_ms": m.expires_at_ms,
        "token": m.token,
    }


def info_doc(info: StreamInfo) -> dict[str, Any]:
    """A :class:`StreamDescription` document."""
    return msgspec.to_builtins(info)  # type: ignore[no-any-return]


def stats_doc(stats: StreamStats) -> dict[str, Any]:
    """The counts of a :class:`StreamStatsDoc` document (without ``partitions``)."""
    return msgspec.to_builtins(stats)  # type: ignore[no-any-return]
