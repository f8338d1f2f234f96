"""Reading a request costs no enum call: the frame type and the API's schema are looked up
from the ints on the wire (an ``IntEnum`` built from an int is several Python calls, and a
request was paying three: the frame type, the API key for its schema, the API key again
for the gate). Errors still name the API."""

from __future__ import annotations

import enum
from typing import Any

import pytest

from tidewire.errors import UnsupportedVersionError
from tidewire.protocol import Connection, RequestReceived, RequestRejected, Role
from tidewire.protocol.frames import FrameType
from tidewire.protocol.messages import (
    ApiKey,
    FetchPartition,
    FetchRequest,
    PingRequest,
    ProducePartition,
    ProduceRequest,
    schema_for,
)


@pytest.fixture
def enum_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The values ``FrameType(...)`` or ``ApiKey(...)`` were called with."""
    calls: list[Any] = []
    inner = enum.EnumType.__call__

    def counted(cls: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        if cls in (FrameType, ApiKey):
            calls.append(value)
        return inner(cls, value, *args, **kwargs)

    monkeypatch.setattr(enum.EnumType, "__call__", counted)
    return calls


def test_requests_are_read_without_an_enum_call(enum_calls: list[Any]) -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    requests: list[tuple[Any, list[bytes]]] = [
        (ProduceRequest(partitions=[ProducePartition("t", 0, 3)]), [b"abc"]),
        (FetchRequest(partitions=[FetchPartition("t", 0, 0, 1024)]), []),
        (PingRequest(), []),
    ]
    wire = b"".join(bytes(b) for body, data in requests for b in client.send_request(body, data)[1])
    server.receive_data(wire)
    got = [server.next_event() for _ in requests]
    assert all(isinstance(ev, RequestReceived) for ev in got)
    assert [type(ev.body) for ev in got] == [type(b) for b, _ in requests]  # type: ignore[union-attr]
    assert enum_calls == []


def test_an_unsupported_version_still_names_the_api() -> None:
    with pytest.raises(UnsupportedVersionError, match="PRODUCE version 9"):
        schema_for(int(ApiKey.PRODUCE), 9, response=False)
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    _, buffers = client.send_request(PingRequest(), version=7)
    server.receive_data(b"".join(bytes(b) for b in buffers))
    ev = server.next_event()
    assert isinstance(ev, RequestRejected)
    assert isinstance(ev.error, UnsupportedVersionError)
