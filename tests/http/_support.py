"""A broker with the HTTP API on a free port of 127.0.0.1, run on a background thread (the
embedded mode), and a synchronous httpx client for it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tidewire.embedded import EmbeddedBroker
from tidewire.security.config import SecurityConfig
from tidewire.server.http.config import HttpConfig

#: Timeout of every test request (seconds): generous for a loaded CI machine.
TIMEOUT_S = 30.0


@contextlib.contextmanager
def served(data_dir: Path, **settings: Any) -> Iterator[tuple[EmbeddedBroker, httpx.Client]]:
    """A running broker serving HTTP and TCP (``settings``: EmbeddedBroker's), and a client
    with its base URL; the broker is drained on the way out."""
    eb = EmbeddedBroker(str(data_dir), **{"http_port": 0, **settings})
    with (
        eb.running() as running,
        httpx.Client(base_url=running.http_url, timeout=TIMEOUT_S) as client,
    ):
        yield running, client


@contextlib.contextmanager
def api(data_dir: Path, **settings: Any) -> Iterator[httpx.Client]:
    """The client of :func:`served`."""
    with served(data_dir, **settings) as (_, client):
        yield client


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The ``error`` object of an error answer (checking its shape)."""
    doc = response.json()
    assert set(doc) == {"error"}, doc
    err = doc["error"]
    assert set(err) == {"code", "name", "message"}, err
    assert isinstance(err["code"], int)
    assert err["name"]
    assert err["message"]
    return dict(err)


def read_all(client: httpx.Client, topic: str, partition: int) -> list[dict[str, Any]]:
    """Every message of one partition, page by page."""
    out: list[dict[str, Any]] = []
    offset = 0
    while True:
        r = client.get(
            f"/v1/topics/{topic}/partitions/{partition}/messages",
            params={"offset": offset, "limit": 10_000},
        )
        assert r.status_code == 200, r.text
        page = r.json()
        out += page["messages"]
        if not page["messages"]:
            return out
        offset = page["next_offset"]


#: The Host header of requests to 127.0.0.1 (one the gateway allows).
HOST = {"Host": "127.0.0.1"}


@contextlib.contextmanager
def secured(tmp_path: Path) -> Iterator[tuple[EmbeddedBroker, str]]:
    """A broker with authentication on and the HTTP API, and the first superuser's key."""
    eb = EmbeddedBroker(
        str(tmp_path / "data"),
        http=HttpConfig(http_host="127.0.0.1", http_port=0),
        security=SecurityConfig(authentication=True, superusers="admin"),
    )
    with eb.running() as running:
        assert running.broker.bootstrap_key_file is not None
        yield running, running.broker.bootstrap_key_file.read_text().strip()


def run(eb: EmbeddedBroker, coro: Any) -> Any:
    """Run ``coro`` on the embedded broker's loop and return its result."""
    return asyncio.run_coroutine_threadsafe(coro, eb.loop).result(30)
