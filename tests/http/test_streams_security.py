"""``/v1/streams`` with authentication on: the gate checks each route's declared stream
permission (by stream id, literal or prefix) before it runs; a request naming several
streams is refused when one of them is not allowed, naming it; lists show only the streams
the caller may describe."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.http._support import HOST, error_of, run, secured
from tidewire.embedded import EmbeddedBroker
from tidewire.security.model import Acl, Operation, PatternType, ResourceType


def client(eb: EmbeddedBroker, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=eb.http_url, headers={"Authorization": f"Bearer {key}", **HOST}, timeout=30
    )


def test_stream_acls_are_checked_at_the_gate(tmp_path: Path) -> None:
    with secured(tmp_path) as (eb, admin_key):
        store = eb.broker.security
        run(eb, store.create_principal("app"))
        _, key = run(eb, store.create_key("app"))
        run(
            eb,
            store.add_acls(
                [
                    Acl(
                        principal="app",
                        resource_type=ResourceType.STREAM,
                        pattern="app.",
                        pattern_type=PatternType.PREFIX,
                        operation=op,
                    )
                    for op in (Operation.WRITE, Operation.READ, Operation.DESCRIBE)
                ]
            ),
        )
        with client(eb, admin_key) as admin, client(eb, key) as app:
            # Without credentials: 401.
            r = httpx.get(f"{eb.http_url}/v1/streams/app.x/messages", headers=HOST)
            assert r.status_code == 401
            # Its own streams: let through.
            r = app.post("/v1/streams/app.x/messages", json={"value": "mine"})
            assert r.status_code == 200, r.text
            # Ids with '/' are checked whole (percent-encoded or not in the path).
            r = app.post("/v1/streams/app.%2Fdeep/x/messages", json={"value": "deep"})
            assert r.status_code == 200, r.text
            r = app.get("/v1/streams/sec%2Fret/read")
            assert r.status_code == 403
            assert "sec/ret" in error_of(r)["message"]
            # Another's: refused with 403 naming the stream, and nothing stored.
            r = app.post("/v1/streams/secret/messages", json={"value": "no"})
            assert r.status_code == 403
            assert "secret" in error_of(r)["message"]
            assert admin.get("/v1/streams/secret").status_code == 404
            admin.post("/v1/streams/secret/messages", json={"value": "s", "persistent": True})
            for method, url, kwargs in [
                ("GET", "/v1/streams/secret/messages", {}),
                ("GET", "/v1/streams/secret/read", {}),
                ("GET", "/v1/streams/secret", {}),
                ("GET", "/v1/streams/secret/sse", {"headers": {"Accept": "text/event-stream"}}),
                ("POST", "/v1/streams/receive", {"json": {"streams": ["app.x", "secret"]}}),
                ("POST", "/v1/streams/read", {"json": {"positions": {"app.x": "", "secret": ""}}}),
                (
                    "POST",
                    "/v1/streams/messages",
                    {
                        "json": {
                            "items": [
                                {"stream": "app.y", "value": "1"},
                                {"stream": "secret", "value": "2"},
                            ]
                        }
                    },
                ),
            ]:
                r = app.request(method, url, **kwargs)
                assert r.status_code == 403, (method, url, r.text)
                assert "secret" in error_of(r)["message"], (method, url)
            # Nothing was taken or stored by the refused requests.
            assert admin.get("/v1/streams/secret").json()["waiting"] == 1
            assert admin.get("/v1/streams/app.y").status_code == 404
            r = app.post("/v1/streams/receive", json={"streams": ["app.x"]})
            assert [m["value"] for m in r.json()["messages"]] == ["mine"]
            # Lists show what the caller may describe; the counts need the cluster's.
            app.post("/v1/streams/app.z/messages", json={"value": "z"})
            listed = [s["stream"] for s in app.get("/v1/streams").json()["streams"]]
            # app.x: empty, but not idle long enough yet to be forgotten.
            assert listed == ["app./deep/x", "app.x", "app.z"]
            every = [s["stream"] for s in admin.get("/v1/streams").json()["streams"]]
            assert every == ["app./deep/x", "app.x", "app.z", "secret"]
            assert app.get("/v1/stats/streams").status_code == 403
            assert admin.get("/v1/stats/streams").status_code == 200
