"""A protocol connection without I/O: bytes in, events out; messages in, bytes out.

The client and the server each own one :class:`Connection` per socket and drive it the same
way: hand it what the socket read (:meth:`Connection.receive_data`), take events from
:meth:`Connection.next_event` until it says :data:`NEED_DATA`, and write what the ``send_*``
methods return.

Many requests may be in flight on one connection; responses are matched by correlation id, in
any order. The server side stops producing :class:`RequestReceived` events while
``max_in_flight`` requests await their response (:data:`PAUSED`: stop reading the socket), so a
client that pipelines without limit only fills its own socket buffers.

States and their transitions, all in :data:`TRANSITIONS`::

    OPEN --EOF received--> CLOSED
    OPEN --ProtocolError--> FAILED       (the caller sends error_frame() and closes)
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tidewire.errors import (
    InvalidRequestError,
    ProtocolError,
    TidewireError,
    TooManyRequestsError,
    UnknownApiError,
    UnsupportedVersionError,
    for_code,
)
from tidewire.protocol.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_ERROR,
    Buffer,
    FrameDecoder,
    FrameType,
    encode_frame,
)
from tidewire.protocol.messages import Body, ErrorBody, decode_body, encode_body, schema_for

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "NEED_DATA",
    "PAUSED",
    "Connection",
    "ConnectionClosed",
    "PushReceived",
    "RequestReceived",
    "RequestRejected",
    "ResponseReceived",
    "Role",
    "State",
]

#: Requests one connection may have in flight by default: enough to pipeline a producer's
#: batches for many partitions, few enough that one client cannot pile work on the broker.
DEFAULT_MAX_IN_FLIGHT = 256
#: Timed-out requests whose late responses a client still recognises and drops: beyond this
#: many, the oldest is forgotten for good (its response then breaks the connection).
MAX_FORGOTTEN = 1024


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


class State(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"
    FAILED = "failed"


class _Input(enum.Enum):
    EOF = "eof"
    PROTOCOL_ERROR = "protocol error"


#: Every state transition of a connection, as data: (state, input) -> next state.
TRANSITIONS: dict[tuple[State, _Input], State] = {
    (State.OPEN, _Input.EOF): State.CLOSED,
    (State.OPEN, _Input.PROTOCOL_ERROR): State.FAILED,
}


class _Sentinel(enum.Enum):
    NEED_DATA = "need data"
    PAUSED = "paused"


#: :meth:`Connection.next_event`: read more bytes from the socket.
NEED_DATA = _Sentinel.NEED_DATA
#: :meth:`Connection.next_event` (server): too many requests in flight; stop reading until a
#: response is sent.
PAUSED = _Sentinel.PAUSED


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A request for the server. Answer it with :meth:`Connection.send_response` or
    :meth:`Connection.send_error`, or (acks=none produce) :meth:`Connection.discard`."""

    correlation_id: int
    api_key: int
    api_version: int
    body: Any
    data: memoryview


@dataclass(frozen=True, slots=True)
class RequestRejected:
    """A well-framed request the server cannot decode (unknown API, unsupported version, a
    body that fails its schema). Answer it with :meth:`Connection.send_error` and go on."""

    correlation_id: int
    api_key: int
    api_version: int
    error: ProtocolError


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """A response for the client; ``error`` is set when the request as a whole failed.
    Correlation id -1 with an error: the server is closing the connection, and says why."""

    correlation_id: int
    api_key: int
    body: Any
    data: memoryview
    error: TidewireError | None


@dataclass(frozen=True, slots=True)
class PushReceived:
    """A frame the server sent on its own (a subscription's records)."""

    subscription_id: int
    api_key: int
    body: memoryview
    data: memoryview


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The peer closed the connection."""


Event = RequestReceived | RequestRejected | ResponseReceived | PushReceived | ConnectionClosed


class Connection:
    """One end of a protocol connection.

    Args:
        role: client or server.
        max_frame_bytes: the largest frame accepted from the peer.
        max_in_flight: requests awaiting a response at once (server: before it pauses;
            client: before :meth:`send_request` refuses with ``TooManyRequestsError``).
        decoder: the frame decoder to use (one of its own by default); a
            :class:`~tidewire.protocol.frames.BufferedFrameDecoder` lets the socket read into
            it (its ``get_buffer`` / ``buffer_updated``), with ``max_frame_bytes`` its own.
    """

    def __init__(
        self,
        role: Role,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        decoder: FrameDecoder | None = None,
    ) -> None:
        self.role = role
        self.state = State.OPEN
        self.max_in_flight = max_in_flight
        self._decoder = decoder or FrameDecoder(max_frame_bytes=max_frame_bytes)
        self._eof = False
        self._ids = itertools.count(1)
        #: client: correlation id -> (api key, version) of requests awaiting a response;
        #: server: correlation id -> api key of requests received and not yet answered.
        self._in_flight: dict[int, tuple[int, int]] = {}
        self._forgotten: list[int] = []  # client: timed-out requests, oldest first

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet part of a complete frame (a frame being sent)."""
        return self._decoder.buffered

    @property
    def in_flight(self) -> int:
        """Requests awaiting their response."""
        return len(self._in_flight)

    def _move(self, event: _Input) -> None:
        self.state = TRANSITIONS[(self.state, event)]

    # --- input ----------------------------------------------------------------------------------

    def receive_data(self, data: Buffer) -> None:
        """Hand over bytes read from the socket; ``b""`` means the peer closed it."""
        if not data:
            self._eof = True
            return
        self._decoder.receive_data(data)

    def next_event(self) -> Event | _Sentinel:
        """Return the next event, :data:`NEED_DATA`, or (server) :data:`PAUSED`.

        Raises:
            ProtocolError: the peer broke the protocol; the connection is FAILED. A server
                answers with :meth:`error_frame` and closes.
        """
        if self.state is not State.OPEN:
            return ConnectionClosed() if self.state is State.CLOSED else NEED_DATA
        if self.role is Role.SERVER and len(self._in_flight) >= self.max_in_flight:
            return PAUSED
        try:
            while True:
                frame = self._decoder.next_frame()
                if frame is None:
                    if self._eof:
                        self._move(_Input.EOF)
                        return ConnectionClosed()
                    return NEED_DATA
                if self.role is Role.SERVER:
                    return self._on_request(frame.frame_type, frame)
                event = self._on_client_frame(frame.frame_type, frame)
                if event is not None:  # None: a dropped late response; read on
                    return event
        except ProtocolError:
            self._move(_Input.PROTOCOL_ERROR)
            raise

    def _on_request(self, ftype: FrameType, frame: Any) -> RequestReceived | RequestRejected:
        if ftype is not FrameType.REQUEST:
            raise ProtocolError(f"a client sent a {ftype.name.lower()} frame")
        corr = frame.correlation_id
        if corr < 0:
            raise ProtocolError(f"correlation id {corr} is negative (-1 is reserved)")
        if corr in self._in_flight:
            raise ProtocolError(f"correlation id {corr} is already in flight")
        self._in_flight[corr] = (frame.api_key, frame.api_version)
        try:
            schema = schema_for(frame.api_key, frame.api_version, response=False)
            body = decode_body(schema, frame.body)
        except (UnknownApiError, UnsupportedVersionError, InvalidRequestError) as exc:
            # The frame itself is sound, so the connection goes on: only this request fails.
            return RequestRejected(corr, frame.api_key, frame.api_version, exc)
        return RequestReceived(corr, frame.api_key, frame.api_version, body, frame.data)

    def _on_client_frame(
        self, ftype: FrameType, frame: Any
    ) -> ResponseReceived | PushReceived | None:
        if ftype is FrameType.PUSH:
            return PushReceived(frame.correlation_id, frame.api_key, frame.body, frame.data)
        if ftype is not FrameType.RESPONSE:
            raise ProtocolError("the server sent a request frame")
        corr = frame.correlation_id
        if corr == -1 and frame.flags & FLAG_ERROR:
            # The server is closing the connection and says why.
            err = decode_body(ErrorBody, frame.body)
            error = for_code(err.error_code)(err.error_message)
            return ResponseReceived(-1, frame.api_key, None, frame.data, error)
        sent = self._in_flight.pop(corr, None)
        if sent is None and corr in self._forgotten:
            # A late response to a request the client gave up on: drop it.
            self._forgotten.remove(corr)
            return None
        if sent is None:
            raise ProtocolError(f"response to correlation id {corr}, which is not in flight")
        api_key, version = sent
        if frame.api_key != api_key:
            raise ProtocolError(
                f"response to correlation id {corr} has API key {frame.api_key}, "
                f"the request had {api_key}"
            )
        if frame.flags & FLAG_ERROR:
            err = decode_body(ErrorBody, frame.body)
            return ResponseReceived(
                corr, api_key, None, frame.data, for_code(err.error_code)(err.error_message)
            )
        body = decode_body(schema_for(api_key, version, response=True), frame.body)
        return ResponseReceived(corr, api_key, body, frame.data, None)

    # --- output -------------------------------------------------------------------------------

    def send_request(
        self, body: Body, data: Sequence[Buffer] = (), *, version: int = 0
    ) -> tuple[int, list[Buffer]]:
        """(client) Encode a request. Returns its correlation id and the buffers to write.

        Raises:
            TooManyRequestsError: ``max_in_flight`` requests await their response.
        """
        if len(self._in_flight) >= self.max_in_flight:
            raise TooManyRequestsError(
                f"{len(self._in_flight)} requests in flight (max_in_flight={self.max_in_flight})"
            )
        corr = self._next_id()
        self._in_flight[corr] = (int(body.api_key), version)
        return corr, encode_frame(
            FrameType.REQUEST, body.api_key, version, corr, encode_body(body), data
        )

    def _next_id(self) -> int:
        # Ids run through 0..2**31-1 and skip ids still in flight or forgotten; -1 is the
        # server's connection-closing error frame.
        while True:
            corr = next(self._ids) & 0x7FFFFFFF
            if corr not in self._in_flight and corr not in self._forgotten:
                return corr

    def forget(self, correlation_id: int, *, expect_response: bool = True) -> None:
        """(client) Stop waiting for a request's response.

        Args:
            correlation_id: the request.
            expect_response: ``True`` for a timed-out request whose late response must be
                dropped when it comes (the last ``MAX_FORGOTTEN`` are remembered);
                ``False`` for a request the server never answers (an acks=none produce).
        """
        if self._in_flight.pop(correlation_id, None) is not None and expect_response:
            if len(self._forgotten) >= MAX_FORGOTTEN:
                self._forgotten.pop(0)
            self._forgotten.append(correlation_id)

    def send_response(
        self, correlation_id: int, body: Body, data: Sequence[Buffer] = ()
    ) -> list[Buffer]:
        """(server) Encode the response to a request received earlier."""
        api_key, version = self._answer(correlation_id)
        return encode_frame(
            FrameType.RESPONSE, api_key, version, correlation_id, encode_body(body), data
        )

    def send_error(self, correlation_id: int, error: TidewireError) -> list[Buffer]:
        """(server) Answer a request with an error for the request as a whole."""
        api_key, version = self._answer(correlation_id)
        body = encode_body(ErrorBody(error_code=error.code, error_message=error.message))
        return encode_frame(
            FrameType.RESPONSE, api_key, version, correlation_id, body, flags=FLAG_ERROR
        )

    def discard(self, correlation_id: int) -> None:
        """(server) Finish a request that gets no response (an acks=none produce)."""
        self._answer(correlation_id)

    def send_push(
        self, subscription_id: int, api_key: int, body: bytes, data: Sequence[Buffer] = ()
    ) -> list[Buffer]:
        """(server) Encode a frame the server sends on its own."""
        return encode_frame(FrameType.PUSH, api_key, 0, subscription_id, body, data)

    def _answer(self, correlation_id: int) -> tuple[int, int]:
        try:
            return self._in_flight.pop(correlation_id)
        except KeyError:
            raise ValueError(f"no request {correlation_id} awaits a response") from None

    @staticmethod
    def error_frame(error: TidewireError) -> list[Buffer]:
        """(server) The frame that tells a client why its connection is being closed:
        an error response with correlation id -1."""
        body = encode_body(ErrorBody(error_code=error.code, error_message=error.message))
        return encode_frame(FrameType.RESPONSE, -1, 0, -1, body, flags=FLAG_ERROR)
