"""The queue routes with authentication on, through a real broker: a principal without the
permission a route needs is refused with 403 and nothing changes; with it, let through;
the lists show only what it may describe; the WebSocket subscription is gated; the
per-queue series are capped as partitions'."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import InvalidStatus

from tests.http._support import HOST, error_of, run, secured, served
from tidewire.embedded import EmbeddedBroker
from tidewire.security.model import Acl, Operation, PatternType, ResourceType
from tidewire.server.http.config import HttpConfig


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **HOST}


def allow(eb: EmbeddedBroker, who: str, kind: ResourceType, name: str, op: Operation) -> None:
    run(
        eb,
        eb.broker.security.add_acls(
            [
                Acl(
                    principal=who,
                    resource_type=kind,
                    pattern=name,
                    pattern_type=PatternType.LITERAL,
                    operation=op,
                )
            ]
        ),
    )


def test_a_principal_without_the_permission_is_refused(tmp_path: Path) -> None:
    with secured(tmp_path) as (eb, admin):
        store = eb.broker.security
        run(eb, store.create_principal("ivy"))
        _, ivy = run(eb, store.create_key("ivy"))
        with httpx.Client(base_url=eb.http_url, timeout=30) as c:
            assert c.put("/v1/queues/jobs", json={}).status_code == 401
            r = c.put("/v1/queues/jobs", json={}, headers=bearer(admin))
            assert r.status_code == 201, r.text
            assert c.put("/v1/queues/other", json={}, headers=bearer(admin)).status_code == 201

            r = c.put("/v1/queues/mine", json={}, headers=bearer(ivy))
            assert r.status_code == 403, r.text
            assert error_of(r)["message"] == "ivy may not create queue:mine"
            r = c.post(
                "/v1/exchanges/amq.default/publish",
                json={"routing_key": "jobs", "messages": [{"value": "x"}]},
                headers=bearer(ivy),
            )
            assert r.status_code == 403, r.text
            assert "exchange:amq.default" in error_of(r)["message"]
            assert c.post("/v1/queues/jobs/get", json={}, headers=bearer(ivy)).status_code == 403
            assert c.get("/v1/queues/jobs", headers=bearer(ivy)).status_code == 403
            assert c.post("/v1/queues/jobs/purge", headers=bearer(ivy)).status_code == 403
            r = c.post(
                "/v1/bindings",
                json={"exchange": "amq.direct", "destination": "jobs", "key": "k"},
                headers=bearer(ivy),
            )
            assert r.status_code == 403
            # Nothing of it happened.
            names = [q["name"] for q in c.get("/v1/queues", headers=bearer(admin)).json()["queues"]]
            assert names == ["jobs", "other"]
            # Lists show only what may be described.
            assert c.get("/v1/queues", headers=bearer(ivy)).json()["queues"] == []

            allow(eb, "ivy", ResourceType.EXCHANGE, "amq.default", Operation.WRITE)
            allow(eb, "ivy", ResourceType.QUEUE, "jobs", Operation.READ)
            allow(eb, "ivy", ResourceType.QUEUE, "jobs", Operation.DESCRIBE)
            r = c.post(
                "/v1/exchanges/amq.default/publish",
                json={"routing_key": "jobs", "messages": [{"value": "x"}]},
                headers=bearer(ivy),
            )
            assert r.status_code == 200, r.text
            r = c.post("/v1/queues/jobs/get", json={}, headers=bearer(ivy))
            assert r.status_code == 200, r.text
            (m,) = r.json()["messages"]
            r = c.post("/v1/queues/jobs/ack", json={"tags": [m["tag"]]}, headers=bearer(ivy))
            assert r.status_code == 200, r.text
            listed = c.get("/v1/queues", headers=bearer(ivy)).json()["queues"]
            assert [q["name"] for q in listed] == ["jobs"]
            exchanges = c.get("/v1/exchanges", headers=bearer(ivy)).json()["exchanges"]
            # Write implies describe (as Kafka's ACLs): the default exchange alone.
            assert [x["name"] for x in exchanges] == [""]
            # The dead-letter replay needs write on every queue besides read on its own.
            r = c.post("/v1/queues/jobs/dlq/replay", json={"all": True}, headers=bearer(ivy))
            assert r.status_code == 403


def test_the_queue_websocket_is_gated(tmp_path: Path) -> None:
    with secured(tmp_path) as (eb, admin):
        store = eb.broker.security
        run(eb, store.create_principal("ivy"))
        _, ivy = run(eb, store.create_key("ivy"))
        with httpx.Client(base_url=eb.http_url, timeout=30) as c:
            assert c.put("/v1/queues/jobs", json={}, headers=bearer(admin)).status_code == 201
        url = eb.http_url.replace("http://", "ws://") + "/v1/queues/jobs/ws"
        for headers, status in ((HOST, 401), (bearer(ivy), 403)):
            with pytest.raises(InvalidStatus) as info:
                ws_client.connect(url, additional_headers=headers, open_timeout=30)
            assert info.value.response.status_code == status
        allow(eb, "ivy", ResourceType.QUEUE, "jobs", Operation.READ)
        with ws_client.connect(url, additional_headers=bearer(ivy), open_timeout=30) as ws:
            assert '"subscribed"' in str(ws.recv(timeout=30))


def test_per_queue_series_are_capped(tmp_path: Path) -> None:
    with served(
        tmp_path / "data",
        http=HttpConfig(http_host="127.0.0.1", metrics_max_partition_series=2),
    ) as (_, c):
        for name in ("q1", "q2", "q3"):
            assert c.put(f"/v1/queues/{name}", json={}).status_code == 201
        text = c.get("/metrics").text
        assert 'tidewire_queue_consumers{queue="q1"}' in text
        assert 'tidewire_queue_consumers{queue="q2"}' in text
        assert 'tidewire_queue_consumers{queue="q3"}' not in text
        assert "tidewire_queues 3.0" in text
        dropped = [x for x in text.splitlines() if x.startswith("tidewire_metrics_series_dropped")]
        assert dropped
        assert float(dropped[0].split()[-1]) >= 1
