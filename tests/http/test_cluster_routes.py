"""``GET /v1/cluster``, ``GET /v1/cluster/partitions`` and the reassignment routes
(``/v1/cluster/reassignments[/{topic}]``) on a single node: a clear 404 saying it is not a
cluster, in the OpenAPI spec, refused without their permissions. Their answers on a cluster
are tested in tests/cluster/test_cluster_metrics.py."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.http._support import HOST, run, secured, served
from tidewire.security.model import Acl, Operation, ResourceType

_T, _O = ResourceType.TOPIC, Operation

ROUTES = ("/v1/cluster", "/v1/cluster/partitions", "/v1/cluster/metrics")
#: (method, route, body) of the reassignment routes.
MOVES = (
    ("GET", "/v1/cluster/reassignments", None),
    ("GET", "/v1/cluster/reassignments/t", None),
    ("POST", "/v1/cluster/reassignments/t", {"replication_factor": 2}),
    ("DELETE", "/v1/cluster/reassignments/t", None),
)


@pytest.mark.parametrize(
    ("method", "route", "body"), [("GET", r, None) for r in ROUTES] + list(MOVES)
)
def test_a_single_node_says_it_is_not_a_cluster(
    tmp_path: Path, method: str, route: str, body: object
) -> None:
    with served(tmp_path) as (_, c):
        r = c.request(method, route, json=body)
        assert r.status_code == 404, r.text
        err = r.json()["error"]
        assert err["name"] == "InvalidRequestError"
        assert "not a node of a cluster" in err["message"]


def test_in_the_openapi_spec(tmp_path: Path) -> None:
    with served(tmp_path) as (_, c):
        spec = c.get("/openapi.json").json()
        models = ("ClusterStatusDoc", "ClusterPartitionsDoc", "ClusterMetricsDoc")
        for route, model in zip(ROUTES, models, strict=True):
            op = spec["paths"][route]["get"]
            schema = op["responses"]["200"]["content"]["application/json"]["schema"]
            assert schema["$ref"].endswith(f"/{model}")
            assert {"403", "404"} <= set(op["responses"])
        schemas = spec["components"]["schemas"]
        assert {"controller", "nodes", "partitions"} <= set(
            schemas["ClusterStatusDoc"]["properties"]
        )
        assert {"totals", "nodes", "missing_nodes"} <= set(
            schemas["ClusterMetricsDoc"]["properties"]
        )
        assert {"messages_in_per_s", "isr_shrinks", "lease_stale", "partitions_led"} <= set(
            schemas["NodeFiguresDoc"]["properties"]
        )
        row = schemas["ClusterPartitionDoc"]["properties"]
        assert {"leader", "leader_epoch", "replicas", "isr", "high_watermark", "lag"} <= set(row)
        params = {p["name"] for p in spec["paths"]["/v1/cluster/partitions"]["get"]["parameters"]}
        assert params == {"topic", "state"}
        moves = spec["paths"]["/v1/cluster/reassignments/{topic}"]
        assert set(moves) == {"get", "post", "delete"}
        for op in moves.values():
            assert {"403", "404"} <= set(op["responses"])
        body = moves["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body["$ref"].endswith("/ReassignmentRequest")
        assert {p["name"] for p in moves["delete"]["parameters"]} == {"topic", "partition"}
        listed = spec["paths"]["/v1/cluster/reassignments"]["get"]
        assert listed["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "/ClusterMovesDoc"
        )
        move = schemas["ClusterMoveDoc"]["properties"]
        assert {"target", "original", "adding", "removing", "records_left", "bytes_left"} <= set(
            move
        )


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


def test_the_reassignment_routes_need_their_permissions(tmp_path: Path) -> None:
    """Describe on the cluster for the list, describe on the topic for a topic's moves,
    alter on the topic and on the cluster to start or cancel them."""
    with secured(tmp_path) as (eb, admin_key):
        store = eb.broker.security
        run(eb, store.create_principal("app"))
        _, key = run(eb, store.create_key("app"))
        run(
            eb,
            store.add_acls(
                [
                    Acl(principal="app", resource_type=_T, pattern="t", operation=_O.DESCRIBE),
                    Acl(principal="app", resource_type=_T, pattern="t", operation=_O.ALTER),
                ]
            ),
        )

        def status(method: str, route: str, body: object, k: str) -> int:
            r = httpx.request(
                method,
                f"{eb.http_url}{route}",
                json=body,
                headers={"Authorization": f"Bearer {k}", **HOST},
                timeout=30,
            )
            return r.status_code

        for method, route, body in MOVES:
            assert (
                httpx.request(method, f"{eb.http_url}{route}", json=body, headers=HOST).status_code
                == 401
            )
            assert status(method, route, body, admin_key) == 404  # past the gate
        # describe on the topic is enough to see its moves; not the cluster's list; alter on
        # the topic without alter on the cluster does not start or cancel.
        assert status("GET", "/v1/cluster/reassignments/t", None, key) == 404
        assert status("GET", "/v1/cluster/reassignments", None, key) == 403
        assert status("POST", "/v1/cluster/reassignments/t", {"replication_factor": 2}, key) == 403
        assert status("DELETE", "/v1/cluster/reassignments/t", None, key) == 403
        cluster_alter = Acl(
            principal="app",
            resource_type=ResourceType.CLUSTER,
            pattern="cluster",
            operation=_O.ALTER,
        )
        run(eb, store.add_acls([cluster_alter]))
        assert status("DELETE", "/v1/cluster/reassignments/t", None, key) == 404
