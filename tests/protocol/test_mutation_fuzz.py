"""Mutation fuzzing of the decoders: damaged streams of frames are refused with a
``ProtocolError`` or decode to frames that are exactly their bytes; the same through a server
and a client :class:`Connection`, which also decode the bodies.

Every mutant is derived from ``random.Random(f"{SEED}:{name}:{index}")``, so a failure names
its seed and index and :func:`mutant` rebuilds that one input on its own.
"""

from __future__ import annotations

import itertools
import random
import struct
from collections import Counter
from collections.abc import Callable
from functools import cache
from typing import Final

import pytest

from tests.protocol._support import REQUESTED, SAMPLES, drain, join
from tidewire.errors import (
    FrameTooLargeError,
    InvalidRequestError,
    ProtocolError,
    StorageError,
    UnknownApiError,
    UnsupportedVersionError,
)
from tidewire.protocol import (
    Connection,
    FrameDecoder,
    FrameType,
    PushReceived,
    RequestReceived,
    RequestRejected,
    ResponseReceived,
    Role,
    State,
    encode_frame,
)
from tidewire.protocol.frames import FLAG_ERROR
from tidewire.protocol.messages import ApiKey, schema_for

SEED: Final = 20240703
FRAME_MUTANTS: Final = 10_000
CONNECTION_MUTANTS: Final = 4_000
MAX_FRAME: Final = 4096

INTERESTING_INT32 = (0, 1, 13, 14, 15, 17, 18, -1, 2**31 - 1, -(2**31), MAX_FRAME - 4, MAX_FRAME)
INTERESTING_BYTES = (0x00, 0x01, 0x02, 0x03, 0x7F, 0x80, 0xC1, 0xFF)


# --- corpora ----------------------------------------------------------------------------------


def random_frames(rng: random.Random) -> bytes:
    out = b""
    for _ in range(rng.randint(1, 4)):
        body = rng.randbytes(rng.randint(0, 40))
        data = [rng.randbytes(rng.randint(0, 30)) for _ in range(rng.randint(0, 2))]
        frame_type = rng.choice(list(FrameType))
        out += join(
            encode_frame(
                frame_type,
                rng.randint(-5, 20),
                rng.randint(-1, 2),
                rng.randint(-(2**31), 2**31 - 1),
                body,
                data,
                flags=rng.choice((0, FLAG_ERROR)) if frame_type is FrameType.RESPONSE else 0,
            )
        )
    return out


def request_stream(keys: list[ApiKey]) -> tuple[Connection, bytes]:
    """A client that sent one request per key (produce with a data section) and the bytes."""
    client = Connection(Role.CLIENT)
    out = b""
    for key in keys:
        data = [b"batch-bytes!"] if key is ApiKey.PRODUCE else []
        out += join(client.send_request(SAMPLES[key][0], data)[1])
    return client, out


def response_stream(keys: list[ApiKey], rng: random.Random) -> bytes:
    """The server's answers to :func:`request_stream`, shuffled, with errors and pushes."""
    _, requests = request_stream(keys)
    server = Connection(Role.SERVER)
    server.receive_data(requests)
    events, _ = drain(server)
    rng.shuffle(events)
    out = b""
    for event in events:
        assert isinstance(event, RequestReceived)
        if rng.random() < 0.2:
            out += join(server.send_error(event.correlation_id, StorageError("disk full")))
        else:
            data = [b"fetched!"] if event.api_key == ApiKey.FETCH else []
            out += join(
                server.send_response(event.correlation_id, SAMPLES[ApiKey(event.api_key)][1], data)
            )
        if rng.random() < 0.2:
            out += join(server.send_push(3, ApiKey.FETCH, b"\x80", [b"pushed"]))
    if rng.random() < 0.2:
        out += join(Connection.error_frame(FrameTooLargeError("bye")))
    return out


@cache
def corpus(name: str) -> list[tuple[list[ApiKey], bytes]]:
    rng = random.Random(f"{SEED}:{name}")
    out = []
    for _ in range(40):
        keys = rng.sample(REQUESTED, rng.randint(1, 5))
        if name == "frames":
            out.append((keys, random_frames(rng)))
        elif name == "requests":
            out.append((keys, request_stream(keys)[1]))
        else:
            out.append((keys, response_stream(keys, rng)))
    return out


# --- mutations --------------------------------------------------------------------------------


def _flip_bit(rng: random.Random, b: bytearray, other: bytes) -> None:
    if b:
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)


def _set_byte(rng: random.Random, b: bytearray, other: bytes) -> None:
    if b:
        b[rng.randrange(len(b))] = rng.choice((rng.randrange(256), *INTERESTING_BYTES))


def _set_int32(rng: random.Random, b: bytearray, other: bytes) -> None:
    if len(b) >= 4:
        i = rng.randrange(len(b) - 3)
        b[i : i + 4] = struct.pack(">i", rng.choice(INTERESTING_INT32))


def _insert(rng: random.Random, b: bytearray, other: bytes) -> None:
    i = rng.randint(0, len(b))
    b[i:i] = rng.randbytes(rng.randint(1, 8))


def _delete(rng: random.Random, b: bytearray, other: bytes) -> None:
    if b:
        i = rng.randrange(len(b))
        del b[i : i + rng.randint(1, 8)]


def _truncate(rng: random.Random, b: bytearray, other: bytes) -> None:
    del b[rng.randint(0, len(b)) :]


def _duplicate(rng: random.Random, b: bytearray, other: bytes) -> None:
    if b:
        i = rng.randrange(len(b))
        j = rng.randint(i, min(len(b), i + 40))
        k = rng.randint(0, len(b))
        b[k:k] = b[i:j]


def _splice(rng: random.Random, b: bytearray, other: bytes) -> None:
    b[rng.randint(0, len(b)) :] = other[rng.randint(0, len(other)) :]


MUTATIONS: tuple[Callable[[random.Random, bytearray, bytes], None], ...] = (
    _flip_bit,
    _flip_bit,
    _set_byte,
    _set_byte,
    _set_int32,
    _insert,
    _delete,
    _truncate,
    _duplicate,
    _splice,
)


def mutant(name: str, index: int) -> tuple[list[ApiKey], bytes, random.Random]:
    """Mutant ``index`` of corpus ``name``: its API keys, its bytes, and the generator that
    goes on to choose how it is split."""
    rng = random.Random(f"{SEED}:{name}:{index}")
    items = corpus(name)
    keys, original = rng.choice(items)
    b = bytearray(original)
    for _ in range(rng.randint(1, 3)):
        rng.choice(MUTATIONS)(rng, b, rng.choice(items)[1])
    return keys, bytes(b), rng


def random_chunks(rng: random.Random, data: bytes) -> list[bytes]:
    cuts = sorted(rng.randint(0, len(data)) for _ in range(rng.randint(0, 6)))
    bounds = [0, *cuts, len(data)]
    # no empty chunk: b"" is how a Connection is told the peer closed
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


# --- the frame decoder ----------------------------------------------------------------------


def decode_all(chunks: list[bytes]) -> tuple[list[bytes], ProtocolError | None, int]:
    """Frames (re-encoded), the error that stopped the stream, and the bytes left over."""
    decoder = FrameDecoder(max_frame_bytes=MAX_FRAME)
    frames: list[bytes] = []
    try:
        for chunk in chunks:
            decoder.receive_data(chunk)
            while (f := decoder.next_frame()) is not None:
                frames.append(
                    join(
                        encode_frame(
                            f.frame_type,
                            f.api_key,
                            f.api_version,
                            f.correlation_id,
                            bytes(f.body),
                            [f.data],
                            flags=f.flags,
                        )
                    )
                )
    except ProtocolError as exc:
        return frames, exc, -1
    return frames, None, decoder.buffered


def test_mutated_frame_streams_decode_or_raise_only_protocol_errors() -> None:
    outcomes: Counter[str] = Counter()
    for index in range(FRAME_MUTANTS):
        _, data, rng = mutant("frames", index)
        frames, error, left = decode_all([data])
        where = f"mutant frames:{index}"
        # the frames are exactly the stream's bytes, in order
        consumed = b"".join(frames)
        assert data.startswith(consumed), where
        if error is None:
            # what is left is the start of a frame that has not fully arrived
            rest = data[len(consumed) :]
            assert left == len(rest), where
            assert len(rest) < 18 or int.from_bytes(rest[:4], "big", signed=True) + 4 > len(rest)
        # the same outcome however the bytes arrive
        split = decode_all(random_chunks(rng, data))
        assert split[0] == frames, where
        assert type(split[1]) is type(error), where
        assert str(split[1]) == str(error), where
        outcomes[type(error).__name__ if error else ("incomplete" if left else "decoded")] += 1
    # the mutations reach every kind of outcome, not just the first check in the decoder
    assert set(outcomes) == {"decoded", "incomplete", "ProtocolError", "FrameTooLargeError"}
    assert min(outcomes.values()) >= 100, outcomes


# --- through the connections ----------------------------------------------------------------


def run_server(index: int) -> str:
    """Feed request mutant ``index`` to a server; the outcome's name."""
    _, data, rng = mutant("requests", index)
    server = Connection(Role.SERVER, max_frame_bytes=MAX_FRAME)
    try:
        for chunk in random_chunks(rng, data):
            server.receive_data(chunk)
            events, _ = drain(server)
            for event in events:
                if isinstance(event, RequestReceived):
                    schema = schema_for(event.api_key, event.api_version, response=False)
                    assert isinstance(event.body, schema)
                    server.send_response(event.correlation_id, SAMPLES[schema.api_key][1])
                else:
                    assert isinstance(event, RequestRejected)
                    assert isinstance(
                        event.error,
                        UnknownApiError | UnsupportedVersionError | InvalidRequestError,
                    )
                    server.send_error(event.correlation_id, event.error)
    except ProtocolError:
        assert server.state is State.FAILED
        return "ProtocolError"
    return "ok"


def run_client(index: int) -> str:
    """Feed response mutant ``index`` to a client awaiting those responses."""
    keys, data, rng = mutant("responses", index)
    client, _ = request_stream(keys)
    try:
        for chunk in random_chunks(rng, data):
            client.receive_data(chunk)
            events, _ = drain(client)
            for event in events:
                if isinstance(event, ResponseReceived):
                    if event.error is None:
                        schema = schema_for(event.api_key, 0, response=True)
                        assert isinstance(event.body, schema)
                else:
                    assert isinstance(event, PushReceived)
    except ProtocolError:
        assert client.state is State.FAILED
        return "ProtocolError"
    return "ok"


@cache
def connection_outcomes(side: str) -> Counter[str]:
    run = run_server if side == "server" else run_client
    return Counter(run(i) for i in range(CONNECTION_MUTANTS))


@pytest.mark.parametrize("side", ["server", "client"])
def test_mutated_streams_through_a_connection(side: str) -> None:
    """Anything but ProtocolError propagates and fails this test; every
    event that does come out is well-formed."""
    outcomes = connection_outcomes(side)
    assert outcomes["ok"] >= 100, outcomes
    assert outcomes["ProtocolError"] >= 100, outcomes
