"""``/v1/principals``, ``/v1/keys``, ``/v1/acls``, ``/v1/quotas`` and ``/v1/whoami``: the
security administration over HTTP, with authentication off (anonymous) and on (Bearer)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.http._support import error_of, served
from tidewire.security.config import SecurityConfig
from tidewire.security.keys import parse_key

ACL = {"principal": "alice", "resource_type": "topic", "pattern": "orders", "operation": "read"}


def test_principals_keys_acls_quotas(client: httpx.Client) -> None:
    r = client.post("/v1/principals", json={"name": "alice", "roles": ["producer"]})
    assert r.status_code == 201, r.text
    assert r.json() == {
        "name": "alice",
        "kind": "user",
        "roles": ["producer"],
        "created_ms": r.json()["created_ms"],
        "description": "",
        "keys": [],
    }
    r = client.post("/v1/principals", json={"name": "alice"})
    assert r.status_code == 409
    assert error_of(r)["message"] == "principal 'alice' exists already"
    r = client.post("/v1/principals", json={"name": "bob", "roles": ["prodcer"]})
    assert r.status_code == 400
    assert error_of(r)["message"].startswith("unknown role 'prodcer'")
    r = client.post("/v1/principals", json={"name": "a b"})
    assert r.status_code == 400
    assert "principal name 'a b'" in error_of(r)["message"]
    r = client.post("/v1/principals", json={"name": "x", "kind": "robot"})
    assert r.status_code == 400
    assert "kind" in error_of(r)["message"]

    r = client.post("/v1/principals/alice/keys", json={"description": "ci"})
    assert r.status_code == 201, r.text
    created = r.json()
    assert parse_key(created["api_key"])[0] == created["id"]
    assert (created["state"], created["description"]) == ("active", "ci")
    keys = client.get("/v1/principals/alice/keys").json()["keys"]
    assert [k["id"] for k in keys] == [created["id"]]
    assert created["api_key"] not in client.get("/v1/principals").text
    assert client.post("/v1/principals/bob/keys").status_code == 404

    r = client.patch("/v1/principals/alice", json={"roles": ["viewer"], "description": "d"})
    assert r.status_code == 200, r.text
    assert (r.json()["roles"], r.json()["description"]) == (["viewer"], "d")
    assert client.get("/v1/principals/alice").json()["roles"] == ["viewer"]
    assert client.get("/v1/principals/bob").status_code == 404

    r = client.request("DELETE", f"/v1/keys/{created['id']}")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "revoked"
    assert client.delete("/v1/keys/0123456789ab").status_code == 404

    r = client.post("/v1/acls", json={"acls": [ACL]})
    assert r.status_code == 200, r.text
    assert r.json() == {"changed": [{**ACL, "pattern_type": "literal", "effect": "allow"}]}
    assert client.post("/v1/acls", json={"acls": [ACL]}).json() == {"changed": []}
    r = client.post("/v1/acls", json={"acls": [{**ACL, "operation": "eat"}]})
    assert r.status_code == 400
    assert client.get("/v1/acls", params={"matching": "orders"}).json()["acls"][0]["principal"] == (
        "alice"
    )
    assert client.get("/v1/acls", params={"principal": "bob"}).json() == {"acls": []}
    r = client.request("DELETE", "/v1/acls", json={"acls": [ACL]})
    assert r.status_code == 200, r.text
    assert len(r.json()["changed"]) == 1
    assert client.get("/v1/acls").json() == {"acls": []}
    client.post("/v1/acls", json={"acls": [ACL]})
    r = client.delete("/v1/acls", params=ACL)
    assert r.status_code == 200, r.text
    assert len(r.json()["changed"]) == 1
    r = client.delete("/v1/acls", params={**ACL, "operation": "eat"})
    assert r.status_code == 400
    assert "operation" in error_of(r)["message"]

    r = client.put("/v1/quotas/alice", json={"requests_per_s": 10})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "principal": "alice",
        "produce_bytes_per_s": -1,
        "fetch_bytes_per_s": -1,
        "requests_per_s": 10,
    }
    assert client.put("/v1/quotas/bob", json={"requests_per_s": 1}).status_code == 404
    assert client.put("/v1/quotas/alice", json={"requests_per_s": -5}).status_code == 400
    listed = client.get("/v1/quotas").json()
    assert [q["principal"] for q in listed["quotas"]] == ["alice"]
    assert listed["defaults"]["principal"] == "*"
    assert client.delete("/v1/quotas/alice").status_code == 204
    assert client.get("/v1/quotas").json()["quotas"] == []

    assert client.delete("/v1/principals/alice").status_code == 204
    assert client.get("/v1/principals").json() == {"principals": [], "total": 0, "next": None}
    assert client.delete("/v1/principals/alice").status_code == 404

    who = client.get("/v1/whoami").json()
    assert (who["principal"], who["authentication"]) == (None, False)


def test_with_authentication_a_principal_manages_its_own_keys(tmp_path: Path) -> None:
    security = SecurityConfig(authentication=True, superusers="admin")
    with served(tmp_path / "data", security=security) as (eb, client):
        admin_key = (tmp_path / "data" / "bootstrap-admin.key").read_text().strip()
        admin = {"Authorization": f"Bearer {admin_key}"}
        assert client.get("/v1/principals").status_code == 401
        r = client.post("/v1/principals", json={"name": "ops"}, headers=admin)
        assert r.status_code == 201, r.text
        r = client.post("/v1/principals/ops/keys", headers=admin)
        ops = {"Authorization": f"Bearer {r.json()['api_key']}"}

        who = client.get("/v1/whoami", headers=ops).json()
        assert (who["principal"], who["authentication"], who["superuser"]) == ("ops", True, False)
        assert client.get("/v1/whoami", headers=admin).json()["superuser"] is True

        # its own keys: allowed without any ACL
        r = client.post("/v1/principals/ops/keys", json={"description": "2nd"}, headers=ops)
        assert r.status_code == 201, r.text
        second = r.json()["id"]
        assert len(client.get("/v1/principals/ops/keys", headers=ops).json()["keys"]) == 2
        r = client.delete(f"/v1/keys/{second}", params={"principal": "ops"}, headers=ops)
        assert r.status_code == 200, r.text
        # anything else: 403, nothing changed
        version = eb.broker.security.version
        for method, url in (
            ("GET", "/v1/principals"),
            ("POST", "/v1/principals/admin/keys"),
            ("GET", "/v1/principals/admin/keys"),
            ("DELETE", f"/v1/keys/{second}"),
            ("GET", "/v1/acls"),
            ("DELETE", "/v1/quotas/ops"),
        ):
            r = client.request(method, url, headers=ops)
            assert r.status_code == 403, (method, url, r.text)
        assert eb.broker.security.version == version


def test_the_routes_are_in_the_openapi_spec(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    for path, methods in {
        "/v1/principals": {"get", "post"},
        "/v1/principals/{name}": {"get", "patch", "delete"},
        "/v1/principals/{name}/keys": {"get", "post"},
        "/v1/keys/{key_id}": {"delete"},
        "/v1/acls": {"get", "post", "delete"},
        "/v1/quotas": {"get"},
        "/v1/quotas/{name}": {"put", "delete"},
        "/v1/whoami": {"get"},
    }.items():
        assert methods <= set(paths[path]), path
    schemas = spec["components"]["schemas"]
    assert {"CreatePrincipalBody", "CreatedKey", "AclChange", "QuotaBody", "WhoAmI"} <= set(schemas)
