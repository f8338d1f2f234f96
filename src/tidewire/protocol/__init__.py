"""The binary protocol, sans-IO: frames, message schemas, and a connection state machine that
the server and the clients drive with their own sockets. No I/O here at all.

Public names::

    Connection, Role, NEED_DATA, PAUSED          the connection state machine
    RequestReceived, RequestRejected, ResponseReceived, PushReceived,
    ConnectionClosed                             its events
    FrameDecoder, encode_frame, FrameType        framing
    ApiKey and the message schemas               in tidewire.protocol.messages

The byte-by-byte reference is docs/protocol.md.
"""

from __future__ import annotations

from tidewire.protocol.connection import (
    NEED_DATA,
    PAUSED,
    Connection,
    ConnectionClosed,
    PushReceived,
    RequestReceived,
    RequestRejected,
    ResponseReceived,
    Role,
    State,
)
from tidewire.protocol.frames import Frame, FrameDecoder, FrameType, encode_frame
from tidewire.protocol.messages import ApiKey

__all__ = [
    "NEED_DATA",
    "PAUSED",
    "ApiKey",
    "Connection",
    "ConnectionClosed",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "PushReceived",
    "RequestReceived",
    "RequestRejected",
    "ResponseReceived",
    "Role",
    "State",
    "encode_frame",
]
