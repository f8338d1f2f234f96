"""``GET /v1/cluster`` and ``GET /v1/cluster/partitions`` on a single node: a clear 404
saying it is not a cluster, in the OpenAPI spec, refused without describe on the cluster.
Their answers on a cluster are tested in tests/cluster/test_cluster_metrics.py."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.http._support import HOST, run, secured, served

ROUTES = ("/v1/cluster", "/v1/cluster/partitions")


@pytest.mark.parametrize("route", ROUTES)
def test_a_single_node_says_it_is_not_a_cluster(tmp_path: Path, route: str) -> None:
    with served(tmp_path) as (_, c):
        r = c.get(route)
        assert r.status_code == 404, r.text
        err = r.json()["error"]
        assert err["name"] == "InvalidRequestError"
        assert "not a node of a cluster" in err["message"]


def test_in_the_openapi_spec(tmp_path: Path) -> None:
    with served(tmp_path) as (_, c):
        spec = c.get("/openapi.json").json()
        for route, model in zip(ROUTES, ("ClusterStatusDoc", "ClusterPartitionsDoc"), strict=True):
            op = spec["paths"][route]["get"]
            schema = op["responses"]["200"]["content"]["application/json"]["schema"]
            assert schema["$ref"].endswith(f"/{model}")
            assert {"403", "404"} <= set(op["responses"])
        schemas = spec["components"]["schemas"]
        assert {"controller", "nodes", "partitions"} <= set(
            schemas["ClusterStatusDoc"]["properties"]
        )
        row = schemas["ClusterPartitionDoc"]["properties"]
        assert {"leader", "leader_epoch", "replicas", "isr", "high_watermark", "lag"} <= set(row)
        params = {p["name"] for p in spec["paths"]["/v1/cluster/partitions"]["get"]["parameters"]}
        assert params == {"topic", "state"}


def test_needs_describe_on_the_cluster(tmp_path: Path) -> None:
    with secured(tmp_path) as (eb, admin_key):
        store = eb.broker.security
        run(eb, store.create_principal("app"))
        _, key = run(eb, store.create_key("app"))
        for route in ROUTES:
            assert httpx.get(f"{eb.http_url}{route}", headers=HOST).status_code == 401
            # The permission is checked before the handler: the admin reaches the 404.
            for k, status in ((key, 403), (admin_key, 404)):
                r = httpx.get(
                    f"{eb.http_url}{route}",
                    headers={"Authorization": f"Bearer {k}", **HOST},
                    timeout=30,
                )
                assert r.status_code == status, r.text
