"""The worked examples of docs/protocol.md, byte for byte: the wire format a client in another
language is written against must not drift from what the code sends."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.protocol._support import deliver, join
from tidewire import errors
from tidewire.errors import FrameTooLargeError, UnsupportedVersionError
from tidewire.protocol import Connection, RequestReceived, RequestRejected, Role
from tidewire.protocol.messages import (
    ACKS_LEADER,
    PingRequest,
    PingResponse,
    ProducePartition,
    ProduceRequest,
)
from tidewire.records import BatchBuilder

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def unhex(text: str) -> bytes:
    """Bytes from a hex dump; an ``0000``-style offset column is dropped."""
    out = b""
    for line in text.strip().splitlines():
        fields = line.split()
        if len(fields[0]) == 4:  # offset column
            fields = fields[1:]
        out += bytes.fromhex("".join(fields))
    return out


def test_ping_request_and_response() -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    corr, buffers = client.send_request(PingRequest())
    assert corr == 1
    assert join(buffers) == unhex("00 00 00 0f 00 00 00 0b 00 00 00 00 00 01 00 00 00 01 80")
    (event,) = deliver(buffers, server, "whole")
    assert isinstance(event, RequestReceived)
    response = join(server.send_response(event.correlation_id, PingResponse()))
    assert response == unhex("00 00 00 0f 01 00 00 0b 00 00 00 00 00 01 00 00 00 01 80")


def test_unsupported_version_error_response() -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    for _ in range(6):
        client.send_request(PingRequest())  # ids 1..6, never delivered
    corr, buffers = client.send_request(PingRequest(), version=1)
    assert corr == 7
    (event,) = deliver(buffers, server, "whole")
    assert isinstance(event, RequestRejected)
    assert isinstance(event.error, UnsupportedVersionError)
    frame = join(server.send_error(corr, event.error))
    message = b"PING version 1 is not supported (supported: 0..0)"
    assert frame == (
        unhex("00 00 00 5c 01 01 00 0b 00 01 00 00 00 07 00 00 00 4e")
        + b"\x82\xaaerror_code\x35\xaderror_message\xd9\x31"
        + message
    )


def test_connection_closing_error_frame() -> None:
    message = b"frame of 100,000,000 bytes exceeds max_frame_bytes=67,108,864"
    server = Connection(Role.SERVER)
    server.receive_data((100_000_000 - 4).to_bytes(4, "big"))
    with pytest.raises(FrameTooLargeError) as info:
        server.next_event()
    assert str(info.value).encode() == message
    assert join(Connection.error_frame(info.value)) == (
        unhex("00 00 00 68 01 01 ff ff 00 00 ff ff ff ff 00 00 00 5a")
        + b"\x82\xaaerror_code\x33\xaderror_message\xd9\x3d"
        + message
    )


PRODUCE_EXAMPLE = """
0000  00 00 00 75 00 00 00 07 00 00 00 00 00 01 00 00
0010  00 1d 82 a4 61 63 6b 73 01 aa 70 61 72 74 69 74
0020  69 6f 6e 73 91 93 a6 65 76 65 6e 74 73 00 4a 00
0030  00 00 00 00 00 00 00 00 00 00 3e ff ff ff ff 02
0040  36 ff 4d c3 00 00 00 00 00 00 00 00 01 8b cf e5
0050  68 00 00 00 01 8b cf e5 68 00 ff ff ff ff ff ff
0060  ff ff ff ff ff ff ff ff 00 00 00 01 18 00 00 00
0070  02 6b 0a 68 65 6c 6c 6f 00
"""


def test_produce_request() -> None:
    builder = BatchBuilder()
    builder.append(b"hello", key=b"k", timestamp_ms=1_700_000_000_000)
    batch = builder.build()
    assert len(batch) == 74
    client = Connection(Role.CLIENT)
    body = ProduceRequest(acks=ACKS_LEADER, partitions=[ProducePartition("events", 0, len(batch))])
    _, buffers = client.send_request(body, [batch])
    assert join(buffers) == unhex(PRODUCE_EXAMPLE)
    assert unhex(PRODUCE_EXAMPLE).hex() in unhex_doc_blocks()


def unhex_doc_blocks() -> str:
    """Every hex dump in the doc's code blocks, as one hex string per block."""
    blocks = re.findall(r"```\n((?:[0-9a-f]{4}(?:  | )[0-9a-f ]+\n)+)```", DOC.read_text("utf-8"))
    return " ".join(unhex(b).hex() for b in blocks)


def doc_registry() -> dict[int, tuple[str, str, str, str]]:
    """code -> (class, parent, retriable, description) from the doc's registry table."""
    rows = re.findall(
        r"^\| (\d+) \| `(\w+)` \| `(\w+)` \| (yes|no) \| (.+?) \|$",
        DOC.read_text("utf-8"),
        flags=re.MULTILINE,
    )
    return {
        int(code): (cls, parent, retriable, text) for code, cls, parent, retriable, text in rows
    }


def code_registry() -> dict[int, tuple[str, str, str, str]]:
    out = {}
    for name in errors.__all__:
        cls = getattr(errors, name)
        if isinstance(cls, type) and issubclass(cls, errors.TidewireError) and cls.code > 0:
            parent = cls.__mro__[1].__name__
            out[cls.code] = (name, parent, "yes" if cls.retriable else "no", cls.description)
    return out


def test_doc_registry_lists_every_code() -> None:
    assert sorted(doc_registry()) == sorted(code_registry())
    for code, (name, parent, retriable, _) in code_registry().items():
        assert doc_registry()[code][:3] == (name, parent, retriable), code


def test_doc_registry_descriptions_match_the_code() -> None:
    doc = doc_registry()
    assert {code: doc[code][3] for code in doc} == {
        code: row[3] for code, row in code_registry().items()
    }
