"""TLS on the HTTP listeners, with real clients: the REST API over https (httpx), a WebSocket
stream over wss (websockets), a compatibility listener; refusals (wrong CA, missing client
certificate, plaintext on the TLS port); the client certificate's principal in the ASGI
scope."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tidewire.client import Producer
from tidewire.embedded import EmbeddedBroker
from tidewire.server.http import HttpConfig
from tidewire.server.http.gateway import HttpGateway

from .conftest import Pki

PROMPT_S = 20.0


def verify(pki: Pki, cert: str | None = None) -> ssl.SSLContext:
    """What httpx and websockets take: the client context of TlsOptions."""
    return pki.client(cert).context()


def test_rest_and_websocket_over_tls(pki: Pki, tmp_path: Path) -> None:
    with EmbeddedBroker(
        str(tmp_path), tls=pki.server(), http_port=0, default_partitions=1
    ).running() as eb:
        assert eb.http_url.startswith("https://127.0.0.1:")
        with Producer(eb.addr, tls=pki.client()) as producer:
            producer.send("web", b"hello").result(PROMPT_S)
        with httpx.Client(base_url=eb.http_url, verify=verify(pki), timeout=PROMPT_S) as http:
            assert http.get("/healthz/live").status_code == 200
            topics = http.get("/v1/topics").json()
            assert "web" in json.dumps(topics)
        ws_url = eb.http_url.replace("https://", "wss://") + "/v1/topics/web/stream?from=earliest"
        with connect(ws_url, ssl=verify(pki), open_timeout=PROMPT_S) as ws:
            assert json.loads(ws.recv(PROMPT_S))["type"] == "subscribed"
            message = json.loads(ws.recv(PROMPT_S))
            assert message["value"] == "hello"
        # Plaintext HTTP on the TLS port gets no answer; TLS with another CA is refused.
        with pytest.raises(httpx.TransportError):
            httpx.get(eb.http_url.replace("https://", "http://") + "/healthz/live", timeout=5)
        other = ssl.create_default_context(cafile=pki.path("other-ca.pem"))
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(eb.http_url + "/healthz/live", verify=other, timeout=PROMPT_S)
        # The listener serves on, and so does the binary one.
        assert httpx.get(eb.http_url + "/healthz/live", verify=verify(pki)).status_code == 200


async def _scope_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers with what the scope says of the connection's TLS."""
    seen = {"tls": scope.get("tidewire.tls"), "principal": scope.get("tidewire.cert_principal")}
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": json.dumps(seen)})
        await send({"type": "websocket.close", "code": 1000})
        return
    body = json.dumps(seen).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _with_gateway(tls: Any, test: Any) -> None:
    async def main() -> None:
        gateway = HttpGateway(tls=tls, grace_s=1.0)
        gateway.add_app("scope", _scope_app, "127.0.0.1", 0)
        async with gateway:
            await test(gateway.port_of("scope"))

    asyncio.run(main())


@pytest.mark.parametrize(("mode", "cert"), [("required", "alice"), ("optional", None)])
def test_the_client_certificate_principal_is_in_the_scope(
    pki: Pki, mode: str, cert: str | None
) -> None:
    async def test(port: int) -> None:
        async with httpx.AsyncClient(verify=verify(pki, cert), timeout=PROMPT_S) as http:
            got = (await http.get(f"https://127.0.0.1:{port}/")).json()
        assert got == {"tls": True, "principal": cert}

        def ws() -> dict[str, Any]:
            with connect(
                f"wss://127.0.0.1:{port}/", ssl=verify(pki, cert), open_timeout=PROMPT_S
            ) as conn:
                return dict(json.loads(conn.recv(PROMPT_S)))

        assert await asyncio.to_thread(ws) == {"tls": True, "principal": cert}

    _with_gateway(pki.mtls(mode), test)


def test_a_plaintext_listener_says_so_in_the_scope(pki: Pki) -> None:
    async def test(port: int) -> None:
        async with httpx.AsyncClient(timeout=PROMPT_S) as http:
            got = (await http.get(f"http://127.0.0.1:{port}/")).json()
        assert got == {"tls": False, "principal": None}

    _with_gateway(None, test)


def test_https_without_a_required_client_certificate_is_refused(pki: Pki) -> None:
    async def test(port: int) -> None:
        async with httpx.AsyncClient(verify=verify(pki), timeout=PROMPT_S) as http:
            response = await http.get(f"https://127.0.0.1:{port}/")
        assert response.status_code == 401
        assert "requires a client certificate" in response.text
        # A client with one is served.
        async with httpx.AsyncClient(verify=verify(pki, "alice"), timeout=PROMPT_S) as http:
            assert (await http.get(f"https://127.0.0.1:{port}/")).status_code == 200

    _with_gateway(pki.mtls("required"), test)


def test_compatibility_listener_over_tls(pki: Pki, tmp_path: Path) -> None:
    http = HttpConfig(http_host="127.0.0.1", http_port=-1, http_msgbus_port=0)

    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path), tls=pki.server(), http=http) as eb:
            assert eb.gateway is not None
            port = eb.gateway.port_of("msgbus")
            async with httpx.AsyncClient(verify=verify(pki), timeout=PROMPT_S) as client:
                response = await client.get(f"https://127.0.0.1:{port}/")
                assert response.status_code == 200

    asyncio.run(main())
