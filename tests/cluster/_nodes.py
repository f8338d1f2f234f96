"""Helpers of the tests that start real node processes: a node with its HTTP listener, a
request to one node, its METADATA, and waiting for a condition with a bound."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.cli._support import popen_serve, stop
from tidewire.client._transport import Transport
from tidewire.protocol.messages import MetadataRequest, MetadataResponse

T = TypeVar("T")


def serve_with_http(data: Path, cluster: str, n: int) -> tuple[subprocess.Popen[str], int, int]:
    """Node ``n`` of ``cluster`` as a ``tidewire serve`` process with an HTTP listener:
    (process, native port, HTTP port)."""
    proc = popen_serve(
        *("--data-dir", str(data), "--port", "0", "--http-port", "0", "--node-id", str(n)),
        *("--cluster", cluster, "--session-timeout", "3"),
    )
    assert proc.stdout is not None
    native = http = None
    for _ in range(5):
        line = proc.stdout.readline()
        if m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
            native = native or int(m.group(1))
        if m := re.search(r"HTTP native listening on http://127\.0\.0\.1:(\d+)", line):
            http = int(m.group(1))
        if native and http:
            return proc, native, http
    stop(proc)
    pytest.fail(f"node {n} did not start")


async def call(addr: str, body: Any, timeout_s: float = 30.0) -> Any:
    """The body of the answer of the node at ``addr`` to ``body``."""
    t = Transport(addr, request_timeout_s=timeout_s, connect_timeout_s=2)
    try:
        reply = await t.request(body)
    finally:
        await t.close()
    assert reply is not None
    return reply.body


async def node_metadata(addr: str) -> MetadataResponse:
    """The METADATA answer of the node at ``addr``."""
    body = await call(addr, MetadataRequest(), 5.0)
    assert isinstance(body, MetadataResponse)
    return body


def wait_until(what: str, probe: Callable[[], T], timeout_s: float) -> T:
    """Call ``probe`` every 0.1 s until it returns something true (its errors count as not
    yet), and return that; fail the test after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < end:
        try:
            got = probe()
            if got:
                return got
        except Exception as exc:  # the last one is reported
            last = exc
        time.sleep(0.1)
    pytest.fail(f"{what}: not within {timeout_s} s (last error: {last!r})")


async def until(what: str, probe: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    """:func:`wait_until` for a coroutine ``probe``, on the running loop."""
    end = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < end:
        try:
            got = await probe()
            if got:
                return got
        except Exception as exc:  # the last one is reported
            last = exc
        await asyncio.sleep(0.1)
    pytest.fail(f"{what}: not within {timeout_s} s (last error: {last!r})")
