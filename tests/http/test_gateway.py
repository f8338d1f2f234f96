"""The gateway: health endpoints, uvicorn inside the broker's loop (port 0, extra apps on
extra ports), a bounded drain that answers long-polls, and ``tidewire serve --http-port``."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.cli._support import STARTUP_S, popen_serve, stop, subprocess_env, tidewire_cmd
from tidewire.broker import Broker, BrokerConfig
from tidewire.config import default_toml, load_settings
from tidewire.errors import InvalidConfigError
from tidewire.server.http import HttpConfig
from tidewire.server.http.gateway import HttpGateway


def test_health_endpoints(client: httpx.Client) -> None:
    for path in ("/healthz/live", "/healthz/ready", "/healthz/startup"):
        r = client.get(path)
        assert r.status_code == 200
        assert r.json() == {"status": "ok", "detail": ""}


def test_openapi_and_docs_are_served(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    assert spec["info"]["title"] == "tidewire"
    post = spec["paths"]["/v1/topics/{topic}/messages"]["post"]
    assert set(post["responses"]) >= {"201", "400", "404", "409", "413", "422", "503"}
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PublishRequest"
    }
    assert "PublishRequest" in spec["components"]["schemas"]
    assert "HTTPValidationError" not in spec["components"]["schemas"]  # 400, never 422
    assert "swagger-ui" in client.get("/docs").text.lower()


def test_gateway_runs_in_the_loop_drains_and_serves_extra_apps(tmp_path: Path) -> None:
    async def extra(scope: dict[str, object], receive: object, send: object) -> None:
        assert scope["type"] == "http"
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"extra"})  # type: ignore[operator]

    async def main() -> None:
        async with Broker(BrokerConfig(str(tmp_path / "d"))) as broker:
            gateway = HttpGateway.for_broker(broker, HttpConfig(http_port=0))
            gateway.add_app("extra", extra, "127.0.0.1", 0)
            await gateway.start()
            assert gateway.names == ["native", "extra"]
            assert gateway.port > 0
            assert gateway.port_of("extra") not in (0, gateway.port)
            with pytest.raises(RuntimeError):
                gateway.add_app("late", extra, "127.0.0.1", 0)
            base = f"http://127.0.0.1:{gateway.port}"
            async with httpx.AsyncClient(base_url=base, timeout=30) as c:
                got = await c.get(f"http://127.0.0.1:{gateway.port_of('extra')}/")
                assert got.text == "extra"
                await c.post("/v1/topics/t/messages", json={"value": "x", "partition": 0})
                poll = asyncio.create_task(
                    c.get(
                        "/v1/topics/t/partitions/0/messages",
                        params={"offset": 1, "wait_ms": 60_000},
                    )
                )
                await asyncio.sleep(0.3)
                assert not poll.done()
                start = time.monotonic()
                closing = asyncio.create_task(gateway.close())
                answer = await asyncio.wait_for(poll, 10)  # answered by the drain, not dropped
                assert answer.status_code == 200
                assert answer.json()["messages"] == []
                await asyncio.wait_for(closing, 15)
                assert time.monotonic() - start < 10
            with pytest.raises(httpx.ConnectError):
                async with httpx.AsyncClient() as c2:
                    await c2.get(base + "/healthz/live")

    asyncio.run(main())


def test_ready_is_503_while_draining(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(BrokerConfig(str(tmp_path / "d"))) as broker:
            gateway = HttpGateway.for_broker(broker, HttpConfig(http_port=0))
            await gateway.start()
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as c:
                    gateway.closing.set()  # what close() does first
                    r = await c.get("/healthz/ready")
                    assert r.status_code == 503
                    assert r.json()["status"] == "draining"
                    assert (await c.get("/healthz/live")).status_code == 200
            finally:
                await gateway.close()

    asyncio.run(main())


def test_a_busy_port_fails_start_and_no_listener_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(BrokerConfig(str(tmp_path / "d"))) as broker:
            first = HttpGateway.for_broker(broker, HttpConfig(http_port=0))
            await first.start()
            try:
                second = HttpGateway.for_broker(broker, HttpConfig(http_port=first.port))
                with pytest.raises(OSError, match="in use"):
                    await second.start()
            finally:
                await first.close()
            with pytest.raises(InvalidConfigError):
                HttpGateway.for_broker(broker, HttpConfig())

    asyncio.run(main())


@pytest.mark.parametrize(
    "kwargs",
    [{"http_port": 70000}, {"http_port": -2}, {"http_host": ""}, {"http_max_body_bytes": 10}],
)
def test_config_bounds(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidConfigError):
        HttpConfig(**kwargs)  # type: ignore[arg-type]


def test_serve_with_http_port(tmp_path: Path) -> None:
    proc = popen_serve("--data-dir", str(tmp_path / "d"), "--port", "0", "--http-port", "0")
    try:
        assert proc.stdout is not None
        tcp = proc.stdout.readline()
        assert re.search(r"listening on 127\.0\.0\.1:\d+", tcp), tcp
        line = proc.stdout.readline()
        m = re.search(r"HTTP native listening on (http://127\.0\.0\.1:\d+)", line)
        assert m, line
        with httpx.Client(base_url=m.group(1), timeout=30) as c:
            assert c.get("/healthz/ready").status_code == 200
            assert c.post("/v1/topics/t/messages", json={"value": "x"}).status_code == 201
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(STARTUP_S) == 0
    finally:
        stop(proc)


def test_serve_reports_a_busy_http_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            tidewire_cmd(
                "serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "--http-port", str(port)
            ),
            capture_output=True,
            text=True,
            env=subprocess_env(),
            timeout=STARTUP_S,
            check=False,
        )
    assert done.returncode == 1
    assert f"error: HTTP native: cannot listen on 127.0.0.1:{port}: " in done.stderr


def test_http_settings_from_file_environment_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("[http]\nhttp_port = 0\nhttp_host = '0.0.0.0'\n", encoding="utf-8")
    s = load_settings(
        path, env={"TIDEWIRE_HTTP_MAX_BODY_BYTES": "4096"}, flags={"http_msgbus_port": 9001}
    )
    assert s.http == HttpConfig(
        http_host="0.0.0.0", http_port=0, http_max_body_bytes=4096, http_msgbus_port=9001
    )
    assert s.origins["http_port"] == f"{path} [http] http_port"
    assert load_settings(None, env={}).http == HttpConfig()  # off by default
    assert not HttpConfig().enabled
    path.write_text("[http]\nhttp_port = 70000\n", encoding="utf-8")
    with pytest.raises(InvalidConfigError, match=r"\[http\] http_port: http_port=70000 must"):
        load_settings(path, env={})
    assert "[http]\n" in default_toml()


def test_compatibility_ports_add_their_listeners(tmp_path: Path) -> None:
    async def main() -> None:
        async with Broker(BrokerConfig(str(tmp_path / "d"))) as broker:
            for key, name in (("http_msgbus_port", "msgbus"), ("http_ipubsub_port", "ipubsub")):
                gateway = HttpGateway.for_broker(broker, HttpConfig(http_port=0, **{key: 0}))
                assert gateway.names == ["native", name]
            only = HttpGateway.for_broker(broker, HttpConfig(http_msgbus_port=0))
            assert only.names == ["msgbus"]

    asyncio.run(main())
