"""``/v1/session``: browser login with an API key, the session cookie as a credential, the
CSRF token on every change it makes, logout, revocation and expiry."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import InvalidStatus

from tests.http._support import error_of, served
from tidewire.errors import AuthenticationFailedError
from tidewire.security.config import SecurityConfig
from tidewire.server.gate import gate_for
from tidewire.server.http.session import SessionStore

SECURITY = SecurityConfig(authentication=True, superusers="admin", auth_failure_delay_ms=0)


def _admin(data: Path) -> dict[str, str]:
    key = (data / "bootstrap-admin.key").read_text().strip()
    return {"Authorization": f"Bearer {key}"}


def test_login_cookie_csrf_logout(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with served(data, security=SECURITY) as (eb, client):
        admin = _admin(data)
        assert client.post("/v1/principals", json={"name": "ops"}, headers=admin).status_code == 201
        r = client.post("/v1/principals/ops/keys", headers=admin)
        ops_key, ops_key_id = r.json()["api_key"], r.json()["id"]
        assert client.get("/v1/session").status_code == 401

        r = client.post("/v1/session", json={"api_key": ops_key})
        assert r.status_code == 200, r.text
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("tidewire_session=")
        for attribute in ("HttpOnly", "SameSite=strict", "Path=/"):
            assert attribute.lower() in cookie.lower(), cookie
        assert "secure" not in cookie.lower()  # a plaintext listener
        doc = r.json()
        assert doc["principal"] == "ops"
        assert doc["authentication"] is True
        assert len(doc["csrf_token"]) >= 43  # 256 bits, base64
        assert doc["expires_at"] > 0
        assert doc["permissions"] == {
            "create_topics": False,
            "alter_topics": False,
            "delete_topics": False,
            "publish": False,
            "read_messages": False,
            "alter_groups": False,
            "describe_cluster": False,
            "alter_cluster": False,
            "read_audit": False,
        }
        csrf = {"X-CSRF-Token": doc["csrf_token"]}
        assert client.get("/v1/session").json()["csrf_token"] == doc["csrf_token"]
        # The cookie authenticates reads...
        assert client.get("/v1/whoami").json()["principal"] == "ops"
        assert client.get("/v1/whoami").json()["mechanism"] == "session"
        # ...and changes only with the CSRF token; permissions still apply.
        r = client.post("/v1/topics", json={"name": "t1"})
        assert r.status_code == 403
        assert "X-CSRF-Token" in error_of(r)["message"]
        r = client.post("/v1/topics", json={"name": "t1"}, headers={"X-CSRF-Token": "nope"})
        assert r.status_code == 403
        assert "does not match" in error_of(r)["message"]
        r = client.post("/v1/topics", json={"name": "t1"}, headers=csrf)
        assert r.status_code == 403
        assert error_of(r)["message"] == "ops may not create topic:t1"
        # A Bearer request needs no token (and a cookie alongside is not used).
        assert client.post("/v1/topics", json={"name": "t1"}, headers=admin).status_code == 201

        # The admin's session may do everything, with the token.
        admin_client = httpx.Client(base_url=str(client.base_url), timeout=30)
        with admin_client:
            key = admin["Authorization"].removeprefix("Bearer ")
            r = admin_client.post("/v1/session", json={"api_key": key})
            assert all(r.json()["permissions"].values())
            token = {"X-CSRF-Token": r.json()["csrf_token"]}
            assert admin_client.post("/v1/topics", json={"name": "t2"}, headers=token).is_success
            assert admin_client.delete("/v1/topics/t2").status_code == 403
            assert admin_client.delete("/v1/topics/t2", headers=token).status_code == 204
            # Logging out needs the token too; then the cookie is cleared and dead.
            assert admin_client.delete("/v1/session").status_code == 403
            r = admin_client.delete("/v1/session", headers=token)
            assert r.status_code == 204
            assert 'tidewire_session=""' in r.headers["set-cookie"]
            assert admin_client.get("/v1/session").status_code == 401

        # Revoking the key ends its session at the next request.
        assert client.delete(f"/v1/keys/{ops_key_id}", headers=admin).status_code == 200
        r = client.get("/v1/whoami")
        assert r.status_code == 401
        assert "revoked" in error_of(r)["message"]
        assert client.get("/v1/session").status_code == 401

        # A wrong key: 401, counted as a failed authentication and audited.
        failures = gate_for(eb.broker).auth_failures
        r = client.post("/v1/session", json={"api_key": "twk_0123456789ab_" + "x" * 43})
        assert r.status_code == 401
        assert gate_for(eb.broker).auth_failures == failures + 1
        r = client.post("/v1/session", json={"api_key": 5})
        assert r.status_code == 400
        assert "api_key" in error_of(r)["message"]
        events = client.get(
            "/v1/audit", params={"outcome": "failed", "action": "authenticate"}, headers=admin
        ).json()["events"]
        assert events, "the failed login is audited"


def test_failed_logins_hit_the_limit(tmp_path: Path) -> None:
    security = SecurityConfig(
        authentication=True, superusers="admin", auth_failure_delay_ms=0, auth_failures_per_minute=3
    )
    with served(tmp_path / "data", security=security) as (_, client):
        codes = [
            client.post("/v1/session", json={"api_key": "twk_0123456789ab_" + "y" * 43}).status_code
            for _ in range(5)
        ]
        assert codes[:3] == [401, 401, 401]
        assert codes[-1] == 429


def test_without_authentication_the_session_is_anonymous(client: httpx.Client) -> None:
    r = client.get("/v1/session")
    assert r.status_code == 200
    doc = r.json()
    assert (doc["principal"], doc["authentication"], doc["csrf_token"], doc["expires_at"]) == (
        "anonymous",
        False,
        None,
        None,
    )
    assert all(doc["permissions"].values())
    r = client.post("/v1/session", json={"api_key": "whatever"})
    assert r.status_code == 200
    assert "set-cookie" not in r.headers
    assert client.delete("/v1/session").status_code == 204
    spec = client.get("/openapi.json").json()
    assert set(spec["paths"]["/v1/session"]) == {"get", "post", "delete"}


def test_store_idle_expiry_and_cap() -> None:
    now = [1000.0]
    store = SessionStore(idle_ms=60_000, max_sessions=2, clock=lambda: now[0])
    t1, s1 = store.create("a", "k1")
    assert store.get(t1) is s1
    now[0] += 59
    assert store.get(t1) is s1  # used: its idle time restarts
    now[0] += 59
    t2, _ = store.create("b", "k2")
    store.get(t1)
    t3, _ = store.create("c", "k2")  # the cap: the least recently used (b) ends
    assert len(store) == 2
    with pytest.raises(AuthenticationFailedError):
        store.get(t2)
    assert store.end_key("k2") == 1
    now[0] += 61
    with pytest.raises(AuthenticationFailedError, match="expired"):
        store.get(t1)
    assert len(store) == 0
    assert not store.end(t3)


def test_the_cookie_opens_a_websocket_stream(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with served(data, security=SECURITY) as (_, client):
        admin = _admin(data)
        assert client.post("/v1/topics", json={"name": "t"}, headers=admin).status_code == 201
        key = admin["Authorization"].removeprefix("Bearer ")
        assert client.post("/v1/session", json={"api_key": key}).status_code == 200
        cookie = f"tidewire_session={client.cookies['tidewire_session']}"
        url = str(client.base_url).replace("http://", "ws://") + "/v1/topics/t/stream"
        with ws_client.connect(url, additional_headers={"Cookie": cookie}, open_timeout=30):
            pass  # opened: the cookie authenticated the handshake
        with pytest.raises(InvalidStatus) as refused:
            ws_client.connect(url, additional_headers={"Cookie": "tidewire_session=x"}).close()
        assert refused.value.response.status_code == 401


def test_the_cookie_is_in_the_openapi_spec(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    scheme = spec["components"]["securitySchemes"]["sessionCookie"]
    assert (scheme["type"], scheme["in"], scheme["name"]) == (
        "apiKey",
        "cookie",
        "tidewire_session",
    )
    assert {"sessionCookie": []} in spec["paths"]["/v1/topics"]["get"]["security"]
    assert "security" not in spec["paths"]["/v1/session"]["post"]
    login = spec["paths"]["/v1/session"]["post"]
    assert login["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "LoginBody"
    )
