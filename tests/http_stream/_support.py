"""Shared helpers of the streaming tests: a real broker with its TCP server and HTTP gateway on
free ports (on a background thread, always stopped), real clients (``websockets``' blocking
client, httpx), and a producer over the binary protocol.

Nothing sleeps: whatever should happen promptly is bounded by :data:`PROMPT_S`; a check that
something does *not* arrive waits :data:`QUIET_S` for it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

from tidewire.client import Client, Message
from tidewire.embedded import EmbeddedBroker
from tidewire.server.http import HttpConfig
from tidewire.storage import LogConfig

#: The bound on anything that should happen at once (s), generous for a loaded CI machine.
PROMPT_S = 10.0
#: How long a test waits to see that nothing more arrives (s).
QUIET_S = 0.5


@contextlib.contextmanager
def gateway(
    data_dir: Path, *, log: LogConfig | None = None, **http: int
) -> Iterator[EmbeddedBroker]:
    """A broker (TCP and HTTP on free ports; ``http``: more HttpConfig settings; ``log``:
    the settings of new topics) on a thread."""
    config = HttpConfig(http_port=0, **http)
    eb = EmbeddedBroker(str(data_dir), http=config, default_partitions=1, log=log or LogConfig())
    with eb.running():
        yield eb


def ws_url(eb: EmbeddedBroker, topic: str, query: str = "") -> str:
    base = eb.http_url.replace("http://", "ws://")
    return f"{base}/v1/topics/{topic}/stream" + (f"?{query}" if query else "")


def open_ws(eb: EmbeddedBroker, topic: str, query: str = "") -> ClientConnection:
    return connect(ws_url(eb, topic, query), open_timeout=PROMPT_S, close_timeout=PROMPT_S)


def recv_json(ws: ClientConnection, timeout: float = PROMPT_S) -> Any:
    frame = ws.recv(timeout=timeout)
    assert isinstance(frame, str), f"a binary frame: {frame!r}"
    return json.loads(frame)


def recv_messages(ws: ClientConnection, n: int) -> list[dict[str, Any]]:
    """The next ``n`` messages (from single or array frames), skipping nothing else: a
    control frame in between fails the test."""
    out: list[dict[str, Any]] = []
    while len(out) < n:
        frame = recv_json(ws)
        items = frame if isinstance(frame, list) else [frame]
        for item in items:
            assert item.get("type") == "message", item
            out.append(item)
    return out


def produce(eb: EmbeddedBroker, topic: str, values: list[bytes], partition: int = 0) -> None:
    with Client(eb.addr) as c:
        c.produce(topic, partition, [Message(v) for v in values])


def create(eb: EmbeddedBroker, topic: str, partitions: int = 1) -> None:
    with Client(eb.addr) as c:
        c.create_topic(topic, partitions)
