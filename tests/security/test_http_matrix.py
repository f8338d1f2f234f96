"""Every HTTP route of every listener against the gate, generated from the route table (which
test_gate_http.py checks against the OpenAPI spec and the compatibility apps): without
credentials refused with 401, with a key but without the route's declared permission refused
with 403 and nothing changed, and with exactly those permissions let through. A route without
a sample request here fails the test."""

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
from tidewire.security.model import Acl
from tidewire.server.http.auth import ROUTE_NEEDS, RouteRequest
from tidewire.server.http.config import HttpConfig
from tidewire.server.needs import AUTHENTICATED, PUBLIC

HOST = {"Host": "127.0.0.1"}
T, G = "matrix", "matrix-group"
Q, X = "matrix-queue", "matrix-exchange"
S = "matrix-stream"
ACL = {"principal": "other", "resource_type": "topic", "pattern": "x", "operation": "read"}

#: (listener, method, template) -> (path, query, JSON body): a request of every route.
SAMPLES: dict[tuple[str, str, str], tuple[str, dict[str, str], Any]] = {
    ("native", "GET", "/healthz/storage"): ("/healthz/storage", {}, None),
    ("native", "GET", "/healthz/listeners"): ("/healthz/listeners", {}, None),
    ("native", "GET", "/healthz/recovery"): ("/healthz/recovery", {}, None),
    ("native", "GET", "/v1/topics"): ("/v1/topics", {}, None),
    ("native", "POST", "/v1/topics"): ("/v1/topics", {}, {"name": "new", "partitions": 1}),
    ("native", "GET", "/v1/topics/{topic}"): (f"/v1/topics/{T}", {}, None),
    ("native", "DELETE", "/v1/topics/{topic}"): (f"/v1/topics/{T}", {}, None),
    ("native", "PATCH", "/v1/topics/{topic}"): (
        f"/v1/topics/{T}",
        {},
        {"config": {"retention_ms": 60_000}},
    ),
    ("native", "POST", "/v1/topics/{topic}/messages"): (
        f"/v1/topics/{T}/messages",
        {},
        {"value": "v", "partition": 0},
    ),
    ("native", "POST", "/v1/topics/{topic}/messages:batch"): (
        f"/v1/topics/{T}/messages:batch",
        {},
        {"messages": [{"value": "v", "partition": 0}]},
    ),
    ("native", "GET", "/v1/topics/{topic}/messages"): (f"/v1/topics/{T}/messages", {}, None),
    ("native", "GET", "/v1/topics/{topic}/partitions/{partition}/messages"): (
        f"/v1/topics/{T}/partitions/0/messages",
        {},
        None,
    ),
    ("native", "GET", "/v1/topics/{topic}/stream"): (f"/v1/topics/{T}/stream", {}, None),
    ("native", "WS", "/v1/topics/{topic}/stream"): (f"/v1/topics/{T}/stream", {}, None),
    ("native", "GET", "/v1/exchanges"): ("/v1/exchanges", {}, None),
    ("native", "GET", "/v1/exchanges/{name}"): (f"/v1/exchanges/{X}", {}, None),
    ("native", "PUT", "/v1/exchanges/{name}"): (f"/v1/exchanges/{X}", {}, {"type": "fanout"}),
    ("native", "DELETE", "/v1/exchanges/{name}"): (f"/v1/exchanges/{X}", {}, None),
    ("native", "POST", "/v1/exchanges/{name}/publish"): (
        "/v1/exchanges/amq.default/publish",
        {},
        {"routing_key": Q, "messages": [{"value": "x"}]},
    ),
    ("native", "GET", "/v1/bindings"): ("/v1/bindings", {}, None),
    ("native", "POST", "/v1/bindings"): (
        "/v1/bindings",
        {},
        {"exchange": "amq.fanout", "destination": Q},
    ),
    ("native", "DELETE", "/v1/bindings"): (
        "/v1/bindings",
        {},
        {"exchange": "amq.fanout", "destination": Q},
    ),
    ("native", "GET", "/v1/queues"): ("/v1/queues", {}, None),
    ("native", "GET", "/v1/queues/{name}"): (f"/v1/queues/{Q}", {}, None),
    ("native", "PUT", "/v1/queues/{name}"): (f"/v1/queues/{Q}", {}, {}),
    ("native", "DELETE", "/v1/queues/{name}"): (f"/v1/queues/{Q}", {}, None),
    ("native", "POST", "/v1/queues/{name}/purge"): (f"/v1/queues/{Q}/purge", {}, None),
    ("native", "POST", "/v1/queues/{name}/get"): (f"/v1/queues/{Q}/get", {}, {}),
    ("native", "POST", "/v1/queues/{name}/ack"): (f"/v1/queues/{Q}/ack", {}, {"tags": [1]}),
    ("native", "POST", "/v1/queues/{name}/nack"): (f"/v1/queues/{Q}/nack", {}, {"tags": [1]}),
    ("native", "POST", "/v1/queues/{name}/reject"): (
        f"/v1/queues/{Q}/reject",
        {},
        {"tags": [1]},
    ),
    ("native", "GET", "/v1/queues/{name}/dlq"): (f"/v1/queues/{Q}/dlq", {}, None),
    ("native", "POST", "/v1/queues/{name}/dlq/replay"): (
        f"/v1/queues/{Q}/dlq/replay",
        {},
        {"all": True},
    ),
    ("native", "POST", "/v1/queues/{name}/dlq/purge"): (f"/v1/queues/{Q}/dlq/purge", {}, None),
    ("native", "WS", "/v1/queues/{name}/ws"): (f"/v1/queues/{Q}/ws", {}, None),
    ("native", "GET", "/v1/streams"): ("/v1/streams", {}, None),
    ("native", "GET", "/v1/stats/streams"): ("/v1/stats/streams", {}, None),
    ("native", "GET", "/v1/stats/kafka"): ("/v1/stats/kafka", {}, None),
    ("native", "POST", "/v1/streams/messages"): (
        "/v1/streams/messages",
        {},
        {"items": [{"stream": S, "value": "x"}, {"stream": "matrix-stream-2", "value": "y"}]},
    ),
    ("native", "POST", "/v1/streams/receive"): ("/v1/streams/receive", {}, {"streams": [S]}),
    ("native", "POST", "/v1/streams/read"): ("/v1/streams/read", {}, {"positions": {S: ""}}),
    ("native", "POST", "/v1/streams/{stream}/messages"): (
        f"/v1/streams/{S}/messages",
        {},
        {"value": "x"},
    ),
    ("native", "GET", "/v1/streams/{stream}/messages"): (f"/v1/streams/{S}/messages", {}, None),
    ("native", "GET", "/v1/streams/{stream}/read"): (f"/v1/streams/{S}/read", {}, None),
    ("native", "GET", "/v1/streams/{stream}/sse"): (f"/v1/streams/{S}/sse", {}, None),
    ("native", "GET", "/v1/streams/{stream}"): (f"/v1/streams/{S}", {}, None),
    ("native", "GET", "/v1/cluster"): ("/v1/cluster", {}, None),
    ("native", "GET", "/v1/cluster/partitions"): ("/v1/cluster/partitions", {}, None),
    ("native", "GET", "/v1/cluster/metrics"): ("/v1/cluster/metrics", {}, None),
    ("native", "GET", "/v1/cluster/reassignments"): ("/v1/cluster/reassignments", {}, None),
    ("native", "GET", "/v1/cluster/reassignments/{topic}"): (
        f"/v1/cluster/reassignments/{T}",
        {},
        None,
    ),
    ("native", "POST", "/v1/cluster/reassignments/{topic}"): (
        f"/v1/cluster/reassignments/{T}",
        {},
        {"replication_factor": 2},
    ),
    ("native", "DELETE", "/v1/cluster/reassignments/{topic}"): (
        f"/v1/cluster/reassignments/{T}",
        {},
        None,
    ),
    ("native", "GET", "/v1/groups"): ("/v1/groups", {}, None),
    ("native", "GET", "/v1/groups/{group}"): (f"/v1/groups/{G}", {}, None),
    ("native", "POST", "/v1/groups/{group}/commit"): (
        f"/v1/groups/{G}/commit",
        {},
        {"offsets": [{"topic": T, "partition": 0, "offset": 0}]},
    ),
    ("native", "POST", "/v1/groups/{group}/reset"): (
        f"/v1/groups/{G}/reset",
        {},
        {"topic": T, "to": "earliest"},
    ),
    ("native", "GET", "/v1/principals"): ("/v1/principals", {}, None),
    ("native", "POST", "/v1/principals"): ("/v1/principals", {}, {"name": "newcomer"}),
    ("native", "GET", "/v1/principals/{name}"): ("/v1/principals/other", {}, None),
    ("native", "PATCH", "/v1/principals/{name}"): (
        "/v1/principals/other",
        {},
        {"roles": ["viewer"]},
    ),
    ("native", "DELETE", "/v1/principals/{name}"): ("/v1/principals/other", {}, None),
    ("native", "GET", "/v1/principals/{name}/keys"): ("/v1/principals/other/keys", {}, None),
    ("native", "POST", "/v1/principals/{name}/keys"): ("/v1/principals/other/keys", {}, {}),
    ("native", "DELETE", "/v1/keys/{key_id}"): ("/v1/keys/{other_key}", {}, None),
    ("native", "GET", "/v1/acls"): ("/v1/acls", {}, None),
    ("native", "POST", "/v1/acls"): ("/v1/acls", {}, {"acls": [ACL]}),
    ("native", "DELETE", "/v1/acls"): ("/v1/acls", {}, {"acls": [ACL]}),
    ("native", "GET", "/v1/quotas"): ("/v1/quotas", {}, None),
    ("native", "PUT", "/v1/quotas/{name}"): ("/v1/quotas/other", {}, {"requests_per_s": 5}),
    ("native", "DELETE", "/v1/quotas/{name}"): ("/v1/quotas/other", {}, None),
    ("native", "GET", "/v1/whoami"): ("/v1/whoami", {}, None),
    ("native", "GET", "/v1/settings"): ("/v1/settings", {}, None),
    ("native", "GET", "/v1/audit"): ("/v1/audit", {}, None),
    ("native", "GET", "/metrics"): ("/metrics", {}, None),
    ("native", "GET", "/v1/metrics/recent"): ("/v1/metrics/recent", {}, None),
    ("native", "GET", "/v1/admin/log-levels"): ("/v1/admin/log-levels", {}, None),
    ("native", "PUT", "/v1/admin/log-levels"): (
        "/v1/admin/log-levels",
        {},
        {"logger": "tidewire.matrix", "level": "INFO"},
    ),
    ("metrics", "GET", "/metrics"): ("/metrics", {}, None),
    ("msgbus", "GET", "/"): ("/", {}, None),
    ("msgbus", "PUT", "/{topic:path}"): ("/jobs", {}, "x"),
    ("msgbus", "POST", "/{topic:path}"): ("/jobs", {}, "x"),
    ("msgbus", "GET", "/{topic:path}"): ("/jobs", {}, None),
    ("msgbus", "WS", "/{topic:path}"): ("/jobs", {}, None),
    ("ipubsub", "POST", "/api/v1/streams/send"): (
        "/api/v1/streams/send",
        {},
        {"streamId": "s1", "messageUuid": "u1", "message": "x"},
    ),
    ("ipubsub", "GET", "/api/v1/streams/receive"): (
        "/api/v1/streams/receive",
        {"streamId": "s1", "timeoutSeconds": "0"},
        None,
    ),
}

ROUTES = sorted(
    (listener, method, template)
    for listener, table in ROUTE_NEEDS.items()
    for (method, template), route in table.items()
    if route.requirement is not PUBLIC
)


def test_every_gated_route_has_a_sample() -> None:
    assert set(ROUTES) - set(SAMPLES) == set(), "routes without a sample request"
    assert set(SAMPLES) - set(ROUTES) == set(), "samples of routes that do not exist"


@contextlib.contextmanager
def broker(tmp_path: Path) -> Iterator[tuple[EmbeddedBroker, str]]:
    eb = EmbeddedBroker(
        str(tmp_path / "data"),
        http=HttpConfig(
            http_host="127.0.0.1",
            http_port=0,
            http_msgbus_port=0,
            http_ipubsub_port=0,
            metrics_port=0,
        ),
        security=SecurityConfig(authentication=True, superusers="admin"),
    )
    with eb.running() as running:
        assert running.broker.bootstrap_key_file is not None
        yield running, running.broker.bootstrap_key_file.read_text().strip()


def _run(eb: EmbeddedBroker, coro: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, eb.loop).result(30)


def _state(eb: EmbeddedBroker) -> Any:
    async def take() -> Any:
        b = eb.broker
        ends = {k: log.log_end_offset for k, log in b.logs.logs.items() if k[0] != "__audit"}
        groups = sorted(g.group_id for g in b.groups.list_groups())
        return b.topics(), ends, groups, b.security.version

    return _run(eb, take())


def _status(
    eb: EmbeddedBroker,
    listener: str,
    method: str,
    path: str,
    *,
    query: dict[str, str],
    body: Any,
    key: str | None,
) -> int:
    assert eb.gateway is not None
    port = eb.gateway.port_of(listener)
    headers = dict(HOST)
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if method == "WS":
        url = f"ws://127.0.0.1:{port}{path}"
        try:
            with ws_client.connect(url, additional_headers=headers, open_timeout=30):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code
    kwargs: dict[str, Any] = {"params": query, "headers": headers}
    if isinstance(body, str):
        kwargs["content"] = body.encode()
    elif body is not None:
        kwargs["json"] = body
    with (
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c,
        c.stream(method, path, **kwargs) as r,
    ):
        return r.status_code


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r[0]} {r[1]} {r[2]}")
def test_each_route_refuses_without_credentials_and_without_its_permission(
    tmp_path: Path, route: tuple[str, str, str]
) -> None:
    listener, method, template = route
    with broker(tmp_path) as (eb, admin):
        store = eb.broker.security
        with httpx.Client(base_url=eb.http_url, headers=HOST, timeout=30) as c:
            r = c.post(
                "/v1/topics",
                json={"name": T, "partitions": 1},
                headers={"Authorization": f"Bearer {admin}"},
            )
            assert r.status_code < 300, r.text
        _run(eb, store.create_principal("nobody"))
        _, key = _run(eb, store.create_key("nobody"))
        _run(eb, store.create_principal("other"))
        other_key, _ = _run(eb, store.create_key("other"))
        path, query, body = SAMPLES[route]
        path = path.replace("{other_key}", other_key.id)

        before = _state(eb)
        status = _status(eb, listener, method, path, query=query, body=body, key=None)
        assert status == 401, status
        assert _state(eb) == before

        requirement = ROUTE_NEEDS[listener][(method, template)].requirement
        if requirement is not AUTHENTICATED:
            status = _status(eb, listener, method, path, query=query, body=body, key=key)
            assert status == 403, status
            assert _state(eb) == before
            assert callable(requirement)
            params = _path_params(template, path)
            # Every need, those of a topic that would be created included.
            needs = requirement(RouteRequest(params, query, body))
            assert needs, f"{route} declares no permission"
            _run(
                eb,
                store.add_acls(
                    [
                        Acl(
                            principal="nobody",
                            resource_type=n.resource,
                            pattern=n.name,
                            operation=n.operation,
                        )
                        for n in needs
                    ]
                ),
            )
        status = _status(eb, listener, method, path, query=query, body=body, key=key)
        assert status not in (401, 403), status


def _path_params(template: str, path: str) -> dict[str, str]:
    from starlette.routing import compile_path

    regex, _, _ = compile_path(template)
    m = regex.match(path)
    assert m is not None, (template, path)
    return m.groupdict()
