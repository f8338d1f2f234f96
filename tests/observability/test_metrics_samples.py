"""The recent-samples ring (with an injected clock), ``/v1/metrics/recent``, and the metrics
routes behind the gate."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets.sync.client as ws_client
from prometheus_client.parser import text_string_to_metric_families

from tidewire.embedded import EmbeddedBroker
from tidewire.errors import InvalidConfigError
from tidewire.observability.metrics import metrics_for
from tidewire.observability.samples import MAX_GROUPS, SERIES, RecentSamples
from tidewire.records.builder import BatchBuilder
from tidewire.security.config import SecurityConfig
from tidewire.security.model import CLUSTER_NAME, Acl, Operation, PatternType, ResourceType
from tidewire.server.http.config import HttpConfig

TIMEOUT_S = 30.0


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def batch(n: int) -> bytes:
    b = BatchBuilder()
    for i in range(n):
        b.append(b"v%d" % i, timestamp_ms=1_700_000_000_000)
    return b.build()


def test_ring_rates_groups_and_bounds(tmp_path: Path) -> None:
    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path / "data"), http_port=0) as eb:
            clock = FakeClock(1_000.0)
            ring = RecentSamples(metrics_for(eb.broker), interval_s=5.0, points=4, clock=clock)
            ring.sample()  # the first sample: levels only, no rate yet
            async with eb.client() as client:
                await client.create_topic("t", 1)
                data = batch(50)
                await client.produce_batch("t", 0, data)
                await client.produce_batch("t", 0, data)
                await client.commit_offsets("g", {("t", 0): 30})
                clock.now += 5.0
                ring.sample()
                snap = ring.snapshot()
                assert snap["interval_s"] == 5.0
                assert snap["now"] == 1_005.0
                assert list(snap["series"]) == list(SERIES)
                assert snap["series"]["messages_in_per_s"] == [[1_005.0, 100 / 5]]
                assert snap["series"]["bytes_in_per_s"] == [[1_005.0, 2 * len(data) / 5]]
                assert snap["series"]["bytes_out_per_s"] == [[1_005.0, 0.0]]
                assert snap["series"]["connections"] == [[1_000.0, 0.0], [1_005.0, 1.0]]
                disk = snap["series"]["disk_used_bytes"]
                assert disk[-1][1] >= 2 * len(data)
                assert snap["group_lag"] == {"g": [[1_005.0, 70.0]]}
                # requests: create, 2 produces, commit (and the client's own handshake ones)
                assert snap["series"]["requests_per_s"][0][1] >= 4 / 5
                for _ in range(6):  # the ring keeps `points` points
                    clock.now += 5.0
                    ring.sample()
                snap = ring.snapshot()
                assert len(snap["series"]["connections"]) == 4
                assert snap["series"]["connections"][0][0] == 1_020.0
                assert snap["series"]["messages_in_per_s"][-1] == [1_035.0, 0.0]
                assert len(snap["group_lag"]["g"]) == 4

    asyncio.run(main())


def test_ring_keeps_the_largest_group_lags(tmp_path: Path) -> None:
    async def main() -> None:
        async with EmbeddedBroker(str(tmp_path / "data"), http_port=0, listen=False) as eb:
            b = eb.broker
            await b.produce("t", 0, batch(MAX_GROUPS + 10))
            for i in range(MAX_GROUPS + 5):  # group gNNN lags MAX_GROUPS + 10 - NNN
                await b.groups.commit(f"g{i:03}", {("t", 0): (i, "")})
            lags = metrics_for(b).group_lags(MAX_GROUPS)
            assert len(lags) == MAX_GROUPS
            assert lags == {f"g{i:03}": MAX_GROUPS + 10 - i for i in range(MAX_GROUPS)}

    asyncio.run(main())


def test_ring_settings_are_checked() -> None:
    with pytest.raises(InvalidConfigError, match=r"sample_interval_s=0\.01 must be within"):
        RecentSamples(None, interval_s=0.01)  # type: ignore[arg-type]


def test_recent_route_shape(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            EmbeddedBroker(str(tmp_path / "data"), http_port=0) as eb,
            httpx.AsyncClient(base_url=eb.http_url, timeout=TIMEOUT_S) as http,
        ):
            r = await http.get("/v1/metrics/recent")
            assert r.status_code == 200, r.text
            doc = r.json()
            assert set(doc) == {"interval_s", "now", "series", "group_lag", "stream_series"}
            assert doc["interval_s"] == 5.0
            assert set(doc["series"]) == set(SERIES)
            # The sampler started with the gateway and took its first sample.
            assert len(doc["series"]["connections"]) >= 1
            ts, v = doc["series"]["connections"][0]
            assert isinstance(ts, float)
            assert isinstance(v, float)

    asyncio.run(main())


def test_metrics_routes_need_cluster_describe(tmp_path: Path) -> None:
    """With authentication on: 401 without a key, 403 for a principal without describe on
    the cluster, 200 for one with it (a viewer), and for the superuser."""
    eb = EmbeddedBroker(
        str(tmp_path / "data"),
        http=HttpConfig(http_host="127.0.0.1", http_port=0),
        security=SecurityConfig(authentication=True, superusers="admin"),
    )

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, eb.loop).result(30)

    with eb.running() as running:
        assert running.broker.bootstrap_key_file is not None
        admin = running.broker.bootstrap_key_file.read_text().strip()
        store = running.broker.security
        run(store.create_principal("nobody"))
        _, nobody = run(store.create_key("nobody"))
        run(store.create_principal("viewer"))
        _, viewer = run(store.create_key("viewer"))
        acl = Acl(
            principal="viewer",
            resource_type=ResourceType.CLUSTER,
            pattern=CLUSTER_NAME,
            pattern_type=PatternType.LITERAL,
            operation=Operation.DESCRIBE,
        )
        run(store.add_acls([acl]))
        with httpx.Client(
            base_url=running.http_url, headers={"Host": "127.0.0.1"}, timeout=TIMEOUT_S
        ) as c:
            for path in ("/metrics", "/v1/metrics/recent"):
                assert c.get(path).status_code == 401
                r = c.get(path, headers={"Authorization": f"Bearer {nobody}"})
                assert r.status_code == 403, r.text
                r = c.get(path, headers={"Authorization": f"Bearer {viewer}"})
                assert r.status_code == 200, r.text
                r = c.get(path, headers={"Authorization": f"Bearer {admin}"})
                assert r.status_code == 200, r.text
            text = c.get("/metrics", headers={"Authorization": f"Bearer {admin}"}).text
        got = {
            (x.name, tuple(sorted(x.labels.items()))): x.value
            for f in text_string_to_metric_families(text)
            for x in f.samples
        }
        assert got["tidewire_requests_denied_total", ()] == 2  # nobody's two
        assert got["tidewire_authentications_total", (("result", "ok"),)] >= 6
        # The two refusals went to the audit log (the store was changed directly, unaudited).
        assert got["tidewire_audit_events_total", (("fate", "recorded"),)] == 2
        assert got["tidewire_audit_events_total", (("fate", "lost"),)] == 0


def test_stream_sessions_are_counted(tmp_path: Path) -> None:
    """A WebSocket and an SSE stream open show in tidewire_http_streams_open; closed, the
    gauge is back to 0."""

    def streams(c: httpx.Client) -> dict[str, float]:
        text = c.get("/metrics").text
        return {
            x.labels["kind"]: x.value
            for f in text_string_to_metric_families(text)
            for x in f.samples
            if x.name == "tidewire_http_streams_open"
        }

    with (
        EmbeddedBroker(str(tmp_path / "data"), http_port=0).running() as eb,
        httpx.Client(base_url=eb.http_url, timeout=TIMEOUT_S) as c,
    ):
        assert c.post("/v1/topics", json={"name": "s", "partitions": 1}).status_code in (200, 201)
        assert streams(c) == {"websocket": 0, "sse": 0}
        ws_url = eb.http_url.replace("http://", "ws://") + "/v1/topics/s/stream"
        with ws_client.connect(ws_url, open_timeout=30) as ws:
            assert ws.protocol.state.name == "OPEN"
            assert streams(c)["websocket"] == 1
            with c.stream(
                "GET",
                "/v1/topics/s/stream",
                params={"partition": 0},
                headers={"Accept": "text/event-stream"},
            ) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                assert streams(c) == {"websocket": 1, "sse": 1}
        deadline = time.monotonic() + TIMEOUT_S
        while streams(c) != {"websocket": 0, "sse": 0}:  # the server sees the closes
            assert time.monotonic() < deadline, streams(c)
            time.sleep(0.05)


def test_http_reads_and_connections_are_counted(tmp_path: Path) -> None:
    """Messages read over HTTP count as messages out (as a fetch's do), and an HTTP client's
    keep-alive connection shows in tidewire_connections_open{interface="http"}."""

    def scrape(c: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (x.name, tuple(sorted(x.labels.items()))): x.value
            for f in text_string_to_metric_families(c.get("/metrics").text)
            for x in f.samples
        }

    with (
        EmbeddedBroker(str(tmp_path / "data"), http_port=0).running() as eb,
        httpx.Client(base_url=eb.http_url, timeout=TIMEOUT_S) as c,
    ):
        assert c.post("/v1/topics", json={"name": "h", "partitions": 1}).status_code in (200, 201)
        for i in range(5):
            r = c.post("/v1/topics/h/messages", json={"value": f"m{i}", "partition": 0})
            assert r.status_code == 201, r.text
        page = c.get("/v1/topics/h/partitions/0/messages", params={"offset": 2}).json()
        assert len(page["messages"]) == 3
        got = scrape(c)
        part = (("partition", "0"), ("topic", "h"))
        assert got["tidewire_partition_messages_out_total", part] == 3
        assert got["tidewire_partition_bytes_out_total", part] > 0
        assert got["tidewire_connections_open", (("interface", "http"),)] >= 1


def test_metrics_port_serves_only_metrics(tmp_path: Path) -> None:
    """metrics_port: a listener of its own answering GET /metrics (the same figures), 404
    for anything else; with the API port off it still serves."""
    from tidewire.server.http.config import HttpConfig

    http = HttpConfig(http_host="127.0.0.1", http_port=-1, metrics_port=0)
    with EmbeddedBroker(str(tmp_path / "data"), http=http).running() as eb:
        assert eb.gateway is not None
        assert eb.gateway.names == ["metrics"]
        base = f"http://127.0.0.1:{eb.gateway.port_of('metrics')}"
        with httpx.Client(base_url=base, timeout=TIMEOUT_S) as c:
            r = c.get("/metrics")
            assert r.status_code == 200, r.text
            names = {f.name for f in text_string_to_metric_families(r.text)}
            assert "tidewire_connections_open" in names
            assert c.get("/v1/topics").status_code == 404
