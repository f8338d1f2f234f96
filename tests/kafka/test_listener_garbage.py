"""What a hostile or broken client can send: requests that decode but hold any values
(negative partitions, unknown topics, odd counts, private topic names), for every API and
advertised version, and random bytes behind valid headers. Each request is answered or
closes its connection, no handler fails, and the listener goes on serving."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import struct
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.kafka._support import ANSWER_S, aio, batch, kafka_broker, wire
from tidewire.protocol.kafka import SUPPORTED, ApiKey, RequestHeader, encode_request
from tidewire.protocol.kafka.schema import FieldSpec, Layout, layout

#: Requests per kind of run: bounded so the default run stays fast.
REQUESTS = 150
_NAMES = ["t", "u", "", "__security", "__streams", "x" * 300, "a/b", "ü"]
_INTS = [-(2**31), -3, -2, -1, 0, 1, 2, 5, 1 << 20, 2**31 - 1]


def _value(rng: random.Random, f: FieldSpec) -> Any:
    if f.array:
        if f.nullable and rng.random() < 0.2:
            return None
        return [_scalar(rng, f) for _ in range(rng.randint(0, 3))]
    return _scalar(rng, f)


def _scalar(rng: random.Random, f: FieldSpec) -> Any:
    kind = f.kind
    if kind == "struct":
        assert f.struct is not None
        return _body(rng, f.struct)
    if kind == "string":
        return None if f.nullable and rng.random() < 0.2 else rng.choice(_NAMES)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "uuid":
        return uuid.UUID(int=rng.getrandbits(128)) if rng.random() < 0.5 else uuid.UUID(int=0)
    if kind in ("bytes", "records"):
        choices: list[bytes | None] = [b"", b"\x00" * 10, batch([b"v"]), batch([b"v"])[:-3]]
        if f.nullable:
            choices.append(None)
        return rng.choice(choices)
    if kind == "float64":
        return rng.random()
    ranges = {"int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1), "uint16": (0, 2**16 - 1)}
    if kind in ranges:
        lo, hi = ranges[kind]
        return max(lo, min(hi, rng.choice(_INTS)))
    if kind == "int64":
        return rng.choice([*_INTS, 2**63 - 1, -(2**63)])
    return rng.choice(_INTS)


def _body(rng: random.Random, lay: Layout) -> dict[str, Any]:
    return {f.name: _value(rng, f) for f in (*lay.fields, *lay.tagged)}


@aio
async def test_requests_with_any_values_never_break_the_listener(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(15)
    async with kafka_broker(tmp_path, auto_create_topics=False) as (b, k):
        b.create_topic("t", 2)
        keys = sorted(SUPPORTED)
        for i in range(REQUESTS):
            key = rng.choice(keys)
            version = rng.randint(*SUPPORTED[key])
            lay = layout(key, "request", version)
            assert lay is not None
            body = _body(rng, lay)
            if key == ApiKey.FETCH:  # a long-poll is an answer that comes later: keep it short
                body["max_wait_ms"] = min(max(body["max_wait_ms"], 0), 50)
            frame = encode_request(RequestHeader(key, version, i, "fuzz"), body)
            # An ApiVersions behind it: answered too unless the first closed the connection
            # (a produce with acks=0 has no answer of its own).
            after = encode_request(RequestHeader(ApiKey.API_VERSIONS, 0, -1, None), {})
            async with wire(k.port) as w:
                w.writer.write(frame + after)
                try:
                    got = await asyncio.wait_for(w.reader.read(65536), ANSWER_S)
                except ConnectionError:
                    got = b""
                assert got == b"" or len(got) >= 8, (ApiKey(key).name, version, body)
        async with wire(k.port) as w:
            assert (await w.call(ApiKey.API_VERSIONS, 2, {}))["error_code"] == 0
            assert (await w.call(ApiKey.METADATA, 8, {"topics": None}))["brokers"]
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, failures[0].getMessage()


@aio
async def test_random_bodies_behind_valid_headers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(16)
    async with kafka_broker(tmp_path) as (b, k):
        b.create_topic("t", 2)
        keys = sorted(SUPPORTED)
        for i in range(REQUESTS):
            key = rng.choice(keys)
            version = rng.randint(*SUPPORTED[key])
            body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
            if rng.random() < 0.5:  # often a plausible start: a small count or length
                body = struct.pack(">i", rng.randint(-1, 2)) + body
            frame = struct.pack(">hhih", key, version, i, -1) + body
            async with wire(k.port) as w:
                w.writer.write(struct.pack(">i", len(frame)) + frame)
                with contextlib.suppress(ConnectionError):
                    await asyncio.wait_for(w.reader.read(65536), ANSWER_S)
        async with wire(k.port) as w:
            assert (await w.call(ApiKey.API_VERSIONS, 2, {}))["error_code"] == 0
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not failures, failures[0].getMessage()
