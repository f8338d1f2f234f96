"""``GET /v1/stats/kafka``: the Kafka listener's figures over HTTP, in the OpenAPI spec,
and refused without describe on the cluster."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.http._support import HOST, run, secured, served
from tidewire.observability.kafka_metrics import kafka_stats_for
from tidewire.protocol.kafka import ApiKey, ErrorCode


def test_without_a_kafka_listener(tmp_path: Path) -> None:
    with served(tmp_path) as (_, c):
        r = c.get("/v1/stats/kafka")
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["listening"] is False
        assert doc["port"] is None
        assert doc["requests"] == 0
        assert doc["apis"] == []


def test_figures_of_the_recorder(tmp_path: Path) -> None:
    with served(tmp_path) as (eb, c):
        st = kafka_stats_for(eb.broker)
        st.listening("127.0.0.1", 29092)
        st.connection_opened()
        st.request(ApiKey.METADATA, 8, 0.0004, 0)
        st.request(ApiKey.METADATA, 8, 0.0004, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        st.bytes_in(64)
        st.bytes_out(256)
        doc = c.get("/v1/stats/kafka").json()
        assert doc["listening"] is True
        assert (doc["host"], doc["port"]) == ("127.0.0.1", 29092)
        assert doc["connections"] == 1
        assert (doc["received_bytes"], doc["sent_bytes"]) == (64, 256)
        assert doc["requests"] == 2
        [meta] = doc["apis"]
        assert meta["api"] == "metadata"
        assert meta["versions"] == {"8": 2}
        assert meta["errors_by"] == {"unknown_topic_or_partition": 1}
        assert meta["p50_ms"] == 0.5


def test_in_the_openapi_spec(tmp_path: Path) -> None:
    with served(tmp_path) as (_, c):
        spec = c.get("/openapi.json").json()
        op = spec["paths"]["/v1/stats/kafka"]["get"]
        schema = op["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith("/KafkaStatsDoc")
        props = spec["components"]["schemas"]["KafkaStatsDoc"]["properties"]
        assert {"listening", "port", "connections", "apis"} <= set(props)


def test_needs_describe_on_the_cluster(tmp_path: Path) -> None:
    with secured(tmp_path) as (eb, admin_key):
        store = eb.broker.security
        run(eb, store.create_principal("app"))
        _, key = run(eb, store.create_key("app"))
        assert httpx.get(f"{eb.http_url}/v1/stats/kafka", headers=HOST).status_code == 401
        for k, status in ((key, 403), (admin_key, 200)):
            r = httpx.get(
                f"{eb.http_url}/v1/stats/kafka",
                headers={"Authorization": f"Bearer {k}", **HOST},
                timeout=30,
            )
            assert r.status_code == status, r.text
