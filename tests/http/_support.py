"""A broker with the HTTP API on a free port of 127.0.0.1, run on a background thread (the
embedded mode), and a synchronous httpx client for it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tidewire.embedded import EmbeddedBroker

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
