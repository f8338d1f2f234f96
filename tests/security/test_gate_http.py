"""The gate on the HTTP listeners: Bearer keys, 401/403/429 with the error document, the
WebSocket and SSE streams, the compatibility modes, and every route declared."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import InvalidStatus

from tidewire.embedded import EmbeddedBroker
from tidewire.security.config import SecurityConfig
from tidewire.security.model import Acl, Operation, PatternType, ResourceType
from tidewire.server.http.auth import ROUTE_NEEDS
from tidewire.server.http.config import HttpConfig

HOST = {"Host": "127.0.0.1"}


@contextlib.contextmanager
def secured(tmp_path: Path, **http: Any) -> Iterator[tuple[EmbeddedBroker, str]]:
    eb = EmbeddedBroker(
        str(tmp_path / "data"),
        http=HttpConfig(http_host="127.0.0.1", http_port=0, **http),
        security=SecurityConfig(authentication=True, superusers="admin"),
    )
    with eb.running() as running:
        assert running.broker.bootstrap_key_file is not None
        yield running, running.broker.bootstrap_key_file.read_text().strip()


def run(eb: EmbeddedBroker, coro: Any) -> Any:
    """Run ``coro`` in the embedded broker's loop."""
    return asyncio.run_coroutine_threadsafe(coro, eb.loop).result(30)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_every_route_of_every_listener_declares_its_permission(tmp_path: Path) -> None:
    eb = EmbeddedBroker(
        str(tmp_path / "data"),
        http=HttpConfig(
            http_host="127.0.0.1", http_port=0, http_msgbus_port=0, http_ipubsub_port=0
        ),
    )
    with eb.running() as running:
        spec = httpx.get(f"{running.http_url}/openapi.json", headers=HOST, timeout=30).json()
    declared = ROUTE_NEEDS["native"]
    for path, ops in spec["paths"].items():
        for method in ops:
            assert (method.upper(), path) in declared, f"{method.upper()} {path} declares nothing"
    assert ("WS", "/v1/topics/{topic}/stream") in declared
    assert ("WS", "/v1/queues/{name}/ws") in declared
    listed = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    # WebSocket routes are not in the OpenAPI spec (test_http_matrix.py opens each one).
    sockets = {(m, p) for m, p in declared if m == "WS"}
    stale = set(declared) - listed - sockets
    stale -= {("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/docs/oauth2-redirect")}
    assert not stale, f"declared routes that do not exist: {stale}"
    from tidewire.server.http.compat.ipubsub import create_ipubsub_app
    from tidewire.server.http.compat.msgbus import create_msgbus_app

    for name, app in (
        ("msgbus", create_msgbus_app(eb.broker, max_payload_bytes=8192)),
        ("ipubsub", create_ipubsub_app(eb.broker, max_body_bytes=8192)),
    ):
        for route in app.routes:
            methods = getattr(route, "methods", None) or {"WS"}
            for m in methods - {"HEAD"}:
                assert (m, route.path) in ROUTE_NEEDS[name], f"{name} {m} {route.path}"


def test_bearer_keys_and_refusals(tmp_path: Path) -> None:
    with secured(tmp_path) as (eb, admin):
        url = eb.http_url
        with httpx.Client(base_url=url, headers=HOST, timeout=30) as c:
            r = c.get("/v1/topics")
            assert r.status_code == 401
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert r.json()["error"]["name"] == "AuthenticationFailedError"
            assert c.get("/healthz/live").status_code == 200  # probes stay open
            assert c.get("/openapi.json").status_code == 200
            r = c.get("/v1/topics", headers={"Authorization": "Basic xyz"})
            assert r.status_code == 401
            r = c.post("/v1/topics", json={"name": "t", "partitions": 1}, headers=bearer(admin))
            assert r.status_code in (200, 201), r.text
            store = eb.broker.security
            run(eb, store.create_principal("ivy"))
            _, ivy = run(eb, store.create_key("ivy"))
            r = c.post("/v1/topics/t/messages", json={"value": "x"}, headers=bearer(ivy))
            assert r.status_code == 403, r.text
            assert r.json()["error"]["message"] == "ivy may not write topic:t"
            r = c.post("/v1/topics", json={"name": "u", "partitions": 1}, headers=bearer(ivy))
            assert r.status_code == 403
            assert "u" not in eb.broker.topics()
            run(
                eb,
                store.add_acls(
                    [
                        Acl(
                            principal="ivy",
                            resource_type=ResourceType.TOPIC,
                            pattern="t",
                            pattern_type=PatternType.LITERAL,
                            operation=Operation.WRITE,
                        )
                    ]
                ),
            )
            r = c.post("/v1/topics/t/messages", json={"value": "x"}, headers=bearer(ivy))
            assert r.status_code in (200, 201), r.text
            assert c.get("/v1/topics", headers=bearer(ivy)).json()["topics"] == [
                {"name": "t", "partitions": 1}
            ] or "t" in str(c.get("/v1/topics", headers=bearer(ivy)).json())
            run(eb, store.revoke_key(ivy.split("_")[1]))
            r = c.post("/v1/topics/t/messages", json={"value": "x"}, headers=bearer(ivy))
            assert r.status_code == 401
            assert "revoked" in r.json()["error"]["message"]


def test_websocket_and_sse_streams_are_gated(tmp_path: Path) -> None:
    with secured(tmp_path) as (eb, admin):
        url = eb.http_url
        with httpx.Client(base_url=url, headers=HOST, timeout=30) as c:
            c.post("/v1/topics", json={"name": "s", "partitions": 1}, headers=bearer(admin))
            r = c.get("/v1/topics/s/stream", params={"partition": 0})
            assert r.status_code == 401
        ws_url = url.replace("http://", "ws://") + "/v1/topics/s/stream"
        with pytest.raises(InvalidStatus) as info:
            ws_client.connect(ws_url, additional_headers=HOST, open_timeout=30)
        assert info.value.response.status_code == 401
        with ws_client.connect(
            ws_url, additional_headers={**HOST, **bearer(admin)}, open_timeout=30
        ) as ws:
            assert ws.protocol.state.name == "OPEN"


def test_a_group_stream_needs_read_on_the_group(tmp_path: Path) -> None:
    """``?group=`` makes the WebSocket stream a member of the group (it joins and commits),
    so it needs read on the group as JOIN_GROUP does, not only read on the topic."""
    with secured(tmp_path) as (eb, admin):
        url = eb.http_url
        with httpx.Client(base_url=url, headers=HOST, timeout=30) as c:
            c.post("/v1/topics", json={"name": "s", "partitions": 1}, headers=bearer(admin))
        store = eb.broker.security
        run(eb, store.create_principal("ivy"))
        _, ivy = run(eb, store.create_key("ivy"))

        def allow(rtype: ResourceType, name: str) -> None:
            acl = Acl(principal="ivy", resource_type=rtype, pattern=name, operation=Operation.READ)
            run(eb, store.add_acls([acl]))

        allow(ResourceType.TOPIC, "s")
        ws_url = url.replace("http://", "ws://") + "/v1/topics/s/stream?group=g"
        with pytest.raises(InvalidStatus) as info:
            ws_client.connect(ws_url, additional_headers={**HOST, **bearer(ivy)}, open_timeout=30)
        assert info.value.response.status_code == 403
        assert "g" not in {g.group_id for g in eb.broker.groups.list_groups()}
        allow(ResourceType.GROUP, "g")
        with ws_client.connect(
            ws_url, additional_headers={**HOST, **bearer(ivy)}, open_timeout=30
        ) as ws:
            assert ws.protocol.state.name == "OPEN"


def test_compatibility_listeners_are_gated(tmp_path: Path) -> None:
    with secured(tmp_path, http_msgbus_port=0, http_ipubsub_port=0) as (eb, admin):
        assert eb.gateway is not None
        msgbus = f"http://127.0.0.1:{eb.gateway.port_of('msgbus')}"
        ipubsub = f"http://127.0.0.1:{eb.gateway.port_of('ipubsub')}"
        with httpx.Client(headers=HOST, timeout=30) as c:
            assert c.put(f"{msgbus}/jobs", content=b"x").status_code == 401
            assert "msgbus.jobs" not in eb.broker.topics()
            r = c.put(f"{msgbus}/jobs", content=b"x", headers=bearer(admin))
            assert r.status_code < 300, r.text
            body = {"streamId": "s1", "messageUuid": "u1", "message": "x"}
            assert c.post(f"{ipubsub}/api/v1/streams/send", json=body).status_code == 401
            r = c.post(f"{ipubsub}/api/v1/streams/send", json=body, headers=bearer(admin))
            assert r.status_code < 300, r.text
