"""The connection state machine, a client and a server wired back to back: what one side's
``send_*`` returns is fed to the other's ``receive_data``, whole and byte by byte."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.protocol._support import (
    MODES,
    REQUESTED,
    SAMPLES,
    Mode,
    deliver,
    drain,
    join,
    structs,
)
from tidewire.errors import (
    FrameTooLargeError,
    InvalidRequestError,
    ProtocolError,
    StorageError,
    TidewireError,
    TooManyRequestsError,
    UnknownApiError,
    UnknownError,
    UnsupportedVersionError,
)
from tidewire.protocol import (
    NEED_DATA,
    PAUSED,
    Connection,
    ConnectionClosed,
    FrameType,
    PushReceived,
    RequestReceived,
    RequestRejected,
    ResponseReceived,
    Role,
    State,
    encode_frame,
)
from tidewire.protocol.connection import MAX_FORGOTTEN
from tidewire.protocol.frames import FLAG_ERROR
from tidewire.protocol.messages import (
    ApiKey,
    Body,
    DeleteTopicRequest,
    ErrorBody,
    FetchPartitionResult,
    FetchResponse,
    ListTopicsResponse,
    PingRequest,
    PingResponse,
    ProduceRequest,
    encode_body,
    schema_for,
)

mode_param = pytest.mark.parametrize("mode", MODES)


def pair(**server_kwargs: int) -> tuple[Connection, Connection]:
    return Connection(Role.CLIENT), Connection(Role.SERVER, **server_kwargs)


def one(events: list[Any]) -> Any:
    assert len(events) == 1, events
    return events[0]


def ping_round_trip(client: Connection, server: Connection, mode: Mode) -> None:
    """The connection still works: a ping goes there and back."""
    corr, buffers = client.send_request(PingRequest())
    request = one(deliver(buffers, server, mode))
    assert isinstance(request, RequestReceived)
    assert request.correlation_id == corr
    response = one(deliver(server.send_response(corr, PingResponse()), client, mode))
    assert response == ResponseReceived(corr, ApiKey.PING, PingResponse(), response.data, None)


def raw(
    frame_type: FrameType, api_key: int, correlation_id: int, body: bytes, *, flags: int = 0
) -> bytes:
    return join(encode_frame(frame_type, api_key, 0, correlation_id, body, flags=flags))


def error_body(code: int, message: str) -> bytes:
    return encode_body(ErrorBody(error_code=code, error_message=message))


# --- requests and responses -----------------------------------------------------------------

DATA: dict[ApiKey, list[bytes | bytearray | memoryview]] = {
    ApiKey.PRODUCE: [b"batch one|", memoryview(b"batch two|"), bytearray(b"\x00\xff" * 300)],
    ApiKey.FETCH: [b"fetched " * 50, b""],
}


@mode_param
@pytest.mark.parametrize("key", REQUESTED, ids=[k.name for k in REQUESTED])
def test_request_and_response_for_every_api(key: ApiKey, mode: Mode) -> None:
    client, server = pair()
    request_body, response_body = SAMPLES[key]
    data = DATA.get(key, [])
    expected_data = join(data)

    corr, buffers = client.send_request(request_body, data if key is ApiKey.PRODUCE else ())
    assert client.in_flight == 1
    request = one(deliver(buffers, server, mode))
    assert request == RequestReceived(corr, key, 0, request_body, request.data)
    assert bytes(request.data) == (expected_data if key is ApiKey.PRODUCE else b"")
    assert server.in_flight == 1

    out = server.send_response(corr, response_body, data if key is ApiKey.FETCH else ())
    assert server.in_flight == 0
    response = one(deliver(out, client, mode))
    assert response == ResponseReceived(corr, key, response_body, response.data, None)
    assert type(response.body) is schema_for(key, 0, response=True)
    assert bytes(response.data) == (expected_data if key is ApiKey.FETCH else b"")
    assert client.in_flight == 0
    assert client.state is server.state is State.OPEN
    assert drain(client) == ([], NEED_DATA)
    assert drain(server) == ([], NEED_DATA)


@settings(deadline=None, max_examples=60)
@given(
    key=st.sampled_from(REQUESTED),
    data=st.data(),
    request_data=st.lists(st.binary(max_size=64), max_size=3),
    response_data=st.lists(st.binary(max_size=64), max_size=3),
    mode=st.sampled_from(MODES),
)
def test_random_bodies_and_data_sections_arrive_intact(
    key: ApiKey,
    data: st.DataObject,
    request_data: list[bytes],
    response_data: list[bytes],
    mode: Mode,
) -> None:
    request_body = data.draw(structs(schema_for(key, 0, response=False)), label="request")
    response_body = data.draw(structs(schema_for(key, 0, response=True)), label="response")
    client, server = pair()
    corr, buffers = client.send_request(request_body, request_data)
    request = one(deliver(buffers, server, mode))
    assert (request.body, bytes(request.data)) == (request_body, b"".join(request_data))
    response = one(deliver(server.send_response(corr, response_body, response_data), client, mode))
    assert (response.body, bytes(response.data)) == (response_body, b"".join(response_data))


@mode_param
def test_many_requests_answered_out_of_order(mode: Mode) -> None:
    client, server = pair()
    rng = random.Random(7)
    keys = [rng.choice(REQUESTED) for _ in range(60)]
    sent: dict[int, ApiKey] = {}
    stream: list[Any] = []
    for key in keys:
        corr, buffers = client.send_request(SAMPLES[key][0])
        sent[corr] = key
        stream += buffers
    assert len(sent) == len(keys)  # ids are unique
    assert all(corr > 0 for corr in sent)
    assert client.in_flight == len(keys)

    requests = deliver(stream, server, mode)
    assert [(r.correlation_id, r.api_key) for r in requests] == list(sent.items())
    rng.shuffle(requests)
    answers: list[Any] = []
    for r in requests:
        answers += server.send_response(
            r.correlation_id, SAMPLES[r.api_key][1], [b"answer to %d" % r.correlation_id]
        )
    responses = deliver(answers, client, mode)
    assert [r.correlation_id for r in responses] == [r.correlation_id for r in requests]
    for r in responses:
        assert r.api_key == sent[r.correlation_id]
        assert r.body == SAMPLES[sent[r.correlation_id]][1]
        assert bytes(r.data) == b"answer to %d" % r.correlation_id
    assert client.in_flight == server.in_flight == 0


def test_correlation_ids_count_from_one() -> None:
    client = Connection(Role.CLIENT)
    assert [client.send_request(PingRequest())[0] for _ in range(5)] == [1, 2, 3, 4, 5]


# --- in-flight bounds -----------------------------------------------------------------------


@mode_param
def test_server_pauses_at_max_in_flight_and_resumes_after_an_answer(mode: Mode) -> None:
    client, server = pair(max_in_flight=3)
    stream: list[Any] = []
    for _ in range(6):
        stream += client.send_request(PingRequest())[1]
    first = deliver(stream, server, mode)
    assert [r.correlation_id for r in first] == [1, 2, 3]
    assert server.next_event() is PAUSED
    assert server.next_event() is PAUSED  # asking again does not decode anything
    assert server.in_flight == 3

    # each way of finishing a request lets exactly one more in
    server.send_response(2, PingResponse())
    assert ids(drain(server)) == ([4], PAUSED)
    server.send_error(1, StorageError())
    assert ids(drain(server)) == ([5], PAUSED)
    server.discard(3)
    assert ids(drain(server)) == ([6], PAUSED)
    for corr in (4, 5, 6):
        server.send_response(corr, PingResponse())
    assert drain(server) == ([], NEED_DATA)


def ids(drained: tuple[list[Any], Any]) -> tuple[list[int], Any]:
    events, stop = drained
    assert all(isinstance(e, RequestReceived) for e in events)
    return [e.correlation_id for e in events], stop


def test_client_refuses_to_send_at_its_limit() -> None:
    client = Connection(Role.CLIENT, max_in_flight=2)
    server = Connection(Role.SERVER)
    a, buf_a = client.send_request(PingRequest())
    b, _ = client.send_request(PingRequest())
    with pytest.raises(TooManyRequestsError) as info:
        client.send_request(PingRequest())
    assert info.value.code == 55
    assert info.value.retriable
    assert "max_in_flight=2" in str(info.value)
    assert client.in_flight == 2

    # a response frees a slot
    deliver(buf_a, server, "whole")
    deliver(server.send_response(a, PingResponse()), client, "whole")
    c, _ = client.send_request(PingRequest())
    with pytest.raises(TooManyRequestsError):
        client.send_request(PingRequest())
    # so does giving up on a request
    client.forget(b)
    client.send_request(PingRequest())
    assert client.in_flight == 2
    assert c not in (a, b)


@mode_param
def test_acks_none_produce_gets_no_response(mode: Mode) -> None:
    client, server = pair()
    corr, buffers = client.send_request(ProduceRequest(acks=0, partitions=[]), [b"batch"])
    client.forget(corr, expect_response=False)
    request = one(deliver(buffers, server, mode))
    assert request.body.acks == 0
    server.discard(corr)
    assert client.in_flight == server.in_flight == 0
    ping_round_trip(client, server, mode)


@mode_param
def test_late_response_to_a_forgotten_request_is_dropped(mode: Mode) -> None:
    client, server = pair()
    corr, buffers = client.send_request(PingRequest())
    deliver(buffers, server, mode)
    client.forget(corr)  # timed out
    assert client.in_flight == 0
    next_id = client.send_request(PingRequest())[0]
    assert next_id != corr
    assert deliver(server.send_response(corr, PingResponse()), client, mode) == []
    assert client.state is State.OPEN
    # dropped once: the same id again is a response to nothing
    with pytest.raises(ProtocolError, match="not in flight"):
        deliver([raw(FrameType.RESPONSE, ApiKey.PING, corr, b"\x80")], client, mode)


def test_only_the_last_forgotten_requests_are_remembered() -> None:
    client = Connection(Role.CLIENT, max_in_flight=MAX_FORGOTTEN + 1)
    ids = [client.send_request(PingRequest())[0] for _ in range(MAX_FORGOTTEN + 1)]
    for corr in ids:
        client.forget(corr)
    # the newest are dropped when they come, one at a time ...
    for corr in ids[:0:-1][:5]:
        client.receive_data(raw(FrameType.RESPONSE, ApiKey.PING, corr, b"\x80"))
        assert client.next_event() is NEED_DATA
    # ... the oldest fell out of the window: its response is a protocol error
    client.receive_data(raw(FrameType.RESPONSE, ApiKey.PING, ids[0], b"\x80"))
    with pytest.raises(ProtocolError, match="not in flight"):
        client.next_event()
    assert client.state is State.FAILED


def test_many_late_responses_at_once() -> None:
    client = Connection(Role.CLIENT, max_in_flight=MAX_FORGOTTEN)
    ids = [client.send_request(PingRequest())[0] for _ in range(MAX_FORGOTTEN)]
    for corr in ids:
        client.forget(corr)
    client.receive_data(b"".join(raw(FrameType.RESPONSE, ApiKey.PING, c, b"\x80") for c in ids))
    assert client.next_event() is NEED_DATA
    assert client.state is State.OPEN


# --- rejected requests: the request fails, the connection goes on --------------------------


class _UnknownApi(Body, kw_only=True, omit_defaults=True):
    api_key = 99  # type: ignore[assignment]


class _BadProduce(Body, kw_only=True, omit_defaults=True):
    """A produce request whose ``partitions`` is a str."""

    api_key = ApiKey.PRODUCE
    partitions: str


class _BadDelete(Body, kw_only=True, omit_defaults=True):
    """A delete-topic request without its required ``name``."""

    api_key = ApiKey.DELETE_TOPIC


REJECTIONS = {
    "unknown api": (_UnknownApi(), 0, UnknownApiError, "unknown API key 99"),
    "unsupported version": (PingRequest(), 3, UnsupportedVersionError, "PING version 3"),
    "negative version": (PingRequest(), -1, UnsupportedVersionError, "PING version -1"),
    "field of the wrong type": (
        _BadProduce(partitions="all"),
        0,
        InvalidRequestError,
        "`$.partitions`",
    ),
    "missing field": (_BadDelete(), 0, InvalidRequestError, "missing required field `name`"),
}


@mode_param
@pytest.mark.parametrize(
    ("body", "version", "error_type", "message"), REJECTIONS.values(), ids=REJECTIONS.keys()
)
def test_rejected_request_is_answered_with_an_error(
    body: Body, version: int, error_type: type[ProtocolError], message: str, mode: Mode
) -> None:
    client, server = pair()
    corr, buffers = client.send_request(body, version=version)
    rejected = one(deliver(buffers, server, mode))
    assert isinstance(rejected, RequestRejected)
    assert (rejected.correlation_id, rejected.api_key, rejected.api_version) == (
        corr,
        int(body.api_key),
        version,
    )
    assert type(rejected.error) is error_type
    assert message in str(rejected.error)
    assert server.in_flight == 1  # it still needs its answer

    out = server.send_error(corr, rejected.error)
    response = one(deliver(out, client, mode))
    assert isinstance(response, ResponseReceived)
    assert (response.correlation_id, response.api_key, response.body) == (
        corr,
        int(body.api_key),
        None,
    )
    assert bytes(response.data) == b""
    assert type(response.error) is error_type
    assert response.error.code == error_type.code
    assert str(response.error) == str(rejected.error)
    assert client.in_flight == server.in_flight == 0
    assert client.state is server.state is State.OPEN
    ping_round_trip(client, server, mode)


@pytest.mark.parametrize(
    ("error", "expected_type"),
    [
        (StorageError("disk full"), StorageError),
        (TooManyRequestsError("slow down"), TooManyRequestsError),
        (TidewireError("base"), UnknownError),  # code -1 is not registered
    ],
)
def test_any_error_code_reaches_the_client_as_its_class(
    error: TidewireError, expected_type: type[TidewireError]
) -> None:
    client, server = pair()
    corr, buffers = client.send_request(DeleteTopicRequest(name="t"))
    deliver(buffers, server, "whole")
    response = one(deliver(server.send_error(corr, error), client, "whole"))
    assert type(response.error) is expected_type
    assert response.error.retriable is expected_type.retriable
    assert str(response.error) == str(error)


# --- protocol errors: the connection fails --------------------------------------------------


def _client_with_ping() -> tuple[Connection, int]:
    client = Connection(Role.CLIENT)
    return client, client.send_request(PingRequest())[0]


CLIENT_VIOLATIONS = {
    "response to an unknown id": (
        lambda corr: raw(FrameType.RESPONSE, ApiKey.PING, corr + 1, b"\x80"),
        "not in flight",
    ),
    "response with another api key": (
        lambda corr: raw(FrameType.RESPONSE, ApiKey.METADATA, corr, b"\x80"),
        "API key",
    ),
    "request frame": (lambda corr: raw(FrameType.REQUEST, ApiKey.PING, corr, b"\x80"), "request"),
    "response body off its schema": (
        lambda corr: raw(FrameType.RESPONSE, ApiKey.PING, corr, b"\x90"),
        "PingResponse",
    ),
    "error body off its schema": (
        lambda corr: raw(FrameType.RESPONSE, ApiKey.PING, corr, b"\x80", flags=FLAG_ERROR),
        "error_code",
    ),
    "closing error frame off its schema": (
        lambda corr: raw(FrameType.RESPONSE, -1, -1, b"\xc1", flags=FLAG_ERROR),
        "ErrorBody",
    ),
    "negative length": (lambda corr: b"\xff\xff\xff\xff", "frame length -1"),
    "too large": (lambda corr: b"\x7f\xff\xff\xff", "max_frame_bytes"),
}


@mode_param
@pytest.mark.parametrize(("frame", "message"), CLIENT_VIOLATIONS.values(), ids=CLIENT_VIOLATIONS)
def test_client_fails_on_a_protocol_violation(frame: Any, message: str, mode: Mode) -> None:
    client, corr = _client_with_ping()
    with pytest.raises(ProtocolError, match=message):
        deliver([frame(corr)], client, mode)
    assert client.state is State.FAILED
    # a failed connection produces no more events, whatever arrives (receive_data refuses
    # more bytes once the frame decoder itself has failed)
    with contextlib.suppress(ProtocolError):
        client.receive_data(raw(FrameType.PUSH, 8, 1, b""))
    assert client.next_event() is NEED_DATA


SERVER_VIOLATIONS = {
    "response frame": (raw(FrameType.RESPONSE, ApiKey.PING, 1, b"\x80"), "response frame"),
    "push frame": (raw(FrameType.PUSH, ApiKey.PING, 1, b"\x80"), "push frame"),
    "negative correlation id": (raw(FrameType.REQUEST, ApiKey.PING, -1, b"\x80"), "negative"),
    "most negative id": (raw(FrameType.REQUEST, ApiKey.PING, -(2**31), b"\x80"), "negative"),
    "reused correlation id": (
        raw(FrameType.REQUEST, ApiKey.PING, 5, b"\x80") * 2,
        "already in flight",
    ),
    "error flag on a request": (
        raw(FrameType.REQUEST, ApiKey.PING, 5, b"\x80", flags=FLAG_ERROR),
        "flags",
    ),
    "frame below the header": (b"\x00\x00\x00\x0d", "below"),
    "frame over the limit": (b"\x00\x01\x00\x00", "exceeds max_frame_bytes=4,096"),
}


@mode_param
@pytest.mark.parametrize(("frame", "message"), SERVER_VIOLATIONS.values(), ids=SERVER_VIOLATIONS)
def test_server_fails_on_a_protocol_violation(frame: bytes, message: str, mode: Mode) -> None:
    server = Connection(Role.SERVER, max_frame_bytes=4096)
    with pytest.raises(ProtocolError, match=message) as info:
        deliver([frame], server, mode)
    assert server.state is State.FAILED
    assert server.next_event() is NEED_DATA
    # the server tells the client why, then closes
    client = Connection(Role.CLIENT)
    told = one(deliver(Connection.error_frame(info.value), client, mode))
    assert told.correlation_id == -1
    assert type(told.error) is type(info.value)


@mode_param
@pytest.mark.parametrize(
    "error",
    [
        ProtocolError("unknown frame type 7"),
        FrameTooLargeError("frame of 100,000,000 bytes exceeds max_frame_bytes=67,108,864"),
    ],
)
def test_error_frame_reaches_the_client(error: ProtocolError, mode: Mode) -> None:
    client, _ = _client_with_ping()
    frame = join(Connection.error_frame(error))
    assert frame[4:14] == bytes([FrameType.RESPONSE, FLAG_ERROR]) + b"\xff\xff\x00\x00" + (
        b"\xff" * 4
    )
    event = one(deliver([frame], client, mode))
    assert isinstance(event, ResponseReceived)
    assert (event.correlation_id, event.api_key, event.body) == (-1, -1, None)
    assert type(event.error) is type(error)
    assert event.error.code == error.code
    assert str(event.error) == str(error)
    assert client.in_flight == 1  # the request it was waiting for is not answered by this
    client.receive_data(b"")
    assert client.next_event() == ConnectionClosed()


# --- end of stream and pushes -------------------------------------------------------------


@pytest.mark.parametrize("role", list(Role))
def test_eof_gives_connection_closed(role: Role) -> None:
    conn = Connection(role)
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"")
    assert conn.next_event() == ConnectionClosed()
    assert conn.state is State.CLOSED
    assert conn.next_event() == ConnectionClosed()  # and again, for ever


@mode_param
def test_eof_after_frames_gives_them_first(mode: Mode) -> None:
    client, server = pair()
    stream: list[Any] = []
    for _ in range(3):
        stream += client.send_request(PingRequest())[1]
    torn = join(client.send_request(PingRequest())[1])[:-1]  # an incomplete frame at the end
    events = deliver([*stream, torn], server, mode)
    assert len(events) == 3
    server.receive_data(b"")
    assert drain(server) == ([ConnectionClosed()], ConnectionClosed())
    assert server.state is State.CLOSED


@mode_param
def test_push_frames_reach_the_client(mode: Mode) -> None:
    client, server = pair()
    corr, buffers = client.send_request(PingRequest())
    deliver(buffers, server, mode)
    body = encode_body(FetchResponse(partitions=[FetchPartitionResult(topic="t", partition=0)]))
    stream = [
        *server.send_push(17, ApiKey.FETCH, body, [b"record ", memoryview(b"batches")]),
        *server.send_response(corr, PingResponse()),
        *server.send_push(18, ApiKey.FETCH, b"\x80"),
    ]
    first, response, second = deliver(stream, client, mode)
    assert isinstance(first, PushReceived)
    assert (first.subscription_id, first.api_key) == (17, ApiKey.FETCH)
    assert bytes(first.body) == body  # handed over undecoded
    assert bytes(first.data) == b"record batches"
    assert isinstance(response, ResponseReceived)
    assert response.correlation_id == corr
    assert (second.subscription_id, bytes(second.body), bytes(second.data)) == (18, b"\x80", b"")
    assert server.in_flight == client.in_flight == 0  # pushes are not requests


def test_answering_an_unknown_request_is_a_local_error() -> None:
    server = Connection(Role.SERVER)
    with pytest.raises(ValueError, match="no request 3"):
        server.send_response(3, ListTopicsResponse(topics=[]))
    with pytest.raises(ValueError, match="no request 3"):
        server.send_error(3, StorageError())
    with pytest.raises(ValueError, match="no request 3"):
        server.discard(3)
    assert server.state is State.OPEN


# --- bugs in body decoding, seen through the connection ----------------------------------


def test_server_invalid_utf8_is_rejected() -> None:
    server = Connection(Role.SERVER)
    server.receive_data(raw(FrameType.REQUEST, ApiKey.DELETE_TOPIC, 1, b"\x81\xa4name\xa2\xff\xfe"))
    rejected = server.next_event()
    assert isinstance(rejected, RequestRejected)
    assert isinstance(rejected.error, InvalidRequestError)


def test_client_invalid_utf8_is_a_protocol_error() -> None:
    client, corr = _client_with_ping()
    bad = b"\x82\xaaerror_code\x01\xaderror_message\xa1\xff"
    client.receive_data(raw(FrameType.RESPONSE, ApiKey.PING, corr, bad, flags=FLAG_ERROR))
    with pytest.raises(ProtocolError):
        client.next_event()
    assert client.state is State.FAILED


def test_server_deep_nesting_is_rejected() -> None:
    server = Connection(Role.SERVER)
    body = b"\x81\xa1z" + b"\x91" * 100_000 + b"\xc0"
    server.receive_data(raw(FrameType.REQUEST, ApiKey.PING, 1, body))
    rejected = server.next_event()
    assert isinstance(rejected, RequestRejected)
