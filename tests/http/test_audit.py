"""``GET /v1/audit``: the audit log over HTTP, with its filters, in the OpenAPI spec."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.http._support import error_of
from tidewire.broker import Broker, BrokerConfig
from tidewire.security.audit import Actor, current_actor
from tidewire.server.http import HttpConfig
from tidewire.server.http.gateway import HttpGateway


def test_audit_over_http(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(BrokerConfig(str(tmp_path / "d"))) as broker:
            gateway = HttpGateway.for_broker(broker, HttpConfig(http_port=0))
            await gateway.start()
            try:
                base = f"http://127.0.0.1:{gateway.port}"
                async with httpx.AsyncClient(base_url=base, timeout=30) as c:
                    await check(broker, c)
            finally:
                await gateway.close()

    asyncio.run(main())


async def check(broker: Broker, c: httpx.AsyncClient) -> None:
    audit = broker.audit
    assert audit is not None
    audit.event("CREATE_TOPIC", "ok", resource="topic:orders")
    token = current_actor.set(Actor("alice", "10.0.0.9:5555", "http"))
    try:
        audit.event("POST /v1/topics", "denied", resource="topic:x", reason="no ACL")
    finally:
        current_actor.reset(token)

    r = await c.get("/v1/audit")
    assert r.status_code == 200, r.text
    events = r.json()["events"]
    assert [(e["action"], e["outcome"]) for e in events] == [
        ("CREATE_TOPIC", "ok"),
        ("POST /v1/topics", "denied"),
    ]
    assert events[1] == {
        "time_ms": events[1]["time_ms"],
        "principal": "alice",
        "source": "10.0.0.9:5555",
        "interface": "http",
        "action": "POST /v1/topics",
        "resource": "topic:x",
        "outcome": "denied",
        "reason": "no ACL",
        "detail": {},
    }
    assert events[0]["principal"] is None
    only = await c.get("/v1/audit", params={"principal": "alice", "outcome": "denied"})
    assert [e["resource"] for e in only.json()["events"]] == ["topic:x"]
    anonymous = await c.get("/v1/audit", params={"principal": ""})
    assert [e["resource"] for e in anonymous.json()["events"]] == ["topic:orders"]
    since = events[1]["time_ms"] + 1
    assert (await c.get("/v1/audit", params={"since": since})).json() == {"events": []}
    assert len((await c.get("/v1/audit", params={"limit": 1})).json()["events"]) == 1

    bad = await c.get("/v1/audit", params={"outcome": "maybe"})
    assert bad.status_code == 400
    assert "outcome" in error_of(bad)["message"]
    bad = await c.get("/v1/audit", params={"since": 5, "until": 4})
    assert bad.status_code == 400
    assert error_of(bad)["message"] == "until=4 is before since=5"
    assert (await c.get("/v1/audit", params={"limit": 10_001})).status_code == 400

    spec = (await c.get("/openapi.json")).json()
    get = spec["paths"]["/v1/audit"]["get"]
    assert {p["name"] for p in get["parameters"]} == {
        "since",
        "until",
        "principal",
        "action",
        "outcome",
        "limit",
    }
    assert "AuditPage" in spec["components"]["schemas"]
