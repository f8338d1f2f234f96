"""``GET /v1/settings`` (the settings in effect with their origins, secrets redacted) and
``/healthz/listeners``, ``/healthz/recovery``."""

from __future__ import annotations

from pathlib import Path

from tests.http._support import served
from tidewire.config import SETTINGS
from tidewire.security.config import SecurityConfig
from tidewire.server.http.config import HttpConfig
from tidewire.server.http.settings_api import _SECRET


def test_settings_in_effect_with_origins(tmp_path: Path) -> None:
    with served(tmp_path / "data", default_partitions=4) as (_, client):
        r = client.get("/v1/settings")
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["recorded"] is True
        by_key = {s["key"]: s for s in doc["settings"]}
        assert set(by_key) == {s.key for s in SETTINGS}
        assert {s["section"] for s in doc["settings"]} == {s.section for s in SETTINGS}
        partitions = by_key["default_partitions"]
        assert (partitions["value"], partitions["origin"]) == (4, "program (EmbeddedBroker)")
        assert partitions["env"] == "TIDEWIRE_DEFAULT_PARTITIONS"
        assert partitions["flag"] == "--partitions"
        fsync = by_key["fsync"]
        assert (fsync["value"], fsync["origin"]) == (fsync["default"], "default")
        assert isinstance(fsync["value"], str)
        assert by_key["data_dir"]["value"] == str(tmp_path / "data")
        assert by_key["tls_key_file"]["value"] == ""  # a path: shown
        assert by_key["http_port"]["value"] == 0


def test_secret_names_are_redacted() -> None:
    assert _SECRET.search("sasl_password")
    assert _SECRET.search("oauth_client_secret")
    assert not _SECRET.search("tls_key_file")
    assert not _SECRET.search("password_file")
    # No setting today holds a secret; any that does is redacted by its name.
    assert [s.key for s in SETTINGS if _SECRET.search(s.key)] == []


def test_settings_need_describe_on_the_cluster(tmp_path: Path) -> None:
    security = SecurityConfig(authentication=True, superusers="admin", auth_failure_delay_ms=0)
    data = tmp_path / "data"
    with served(data, security=security) as (_, client):
        admin = {"Authorization": "Bearer " + (data / "bootstrap-admin.key").read_text().strip()}
        assert client.get("/v1/settings").status_code == 401
        client.post("/v1/principals", json={"name": "v"}, headers=admin)
        key = client.post("/v1/principals/v/keys", headers=admin).json()["api_key"]
        assert (
            client.get("/v1/settings", headers={"Authorization": f"Bearer {key}"}).status_code
            == 403
        )
        assert client.get("/v1/settings", headers=admin).json()["recorded"] is True
        assert client.get("/healthz/listeners").status_code == 401


def test_listeners_and_recovery(tmp_path: Path) -> None:
    http = HttpConfig(http_host="127.0.0.1", http_port=0, http_msgbus_port=0)
    with served(tmp_path / "data", http=http) as (eb, client):
        assert client.post("/v1/topics", json={"name": "t", "partitions": 2}).status_code == 201
        doc = client.get("/healthz/listeners").json()
        assert doc["status"] == "ok"
        ports = {x["name"]: (x["host"], x["port"], x["tls"]) for x in doc["listeners"]}
        assert set(ports) == {"binary", "native", "msgbus"}
        assert ports["binary"] == ("127.0.0.1", int(eb.addr.rpartition(":")[2]), False)
        assert ports["native"][1] == eb.gateway.port  # type: ignore[union-attr]
        first = client.get("/healthz/recovery").json()
        assert first["status"] == "ok"
        assert (first["offline"], first["damaged_ranges"]) == (0, 0)
        assert (first["last_start"], first["clean_shutdown"]) == ("new", False)
        assert first["open_seconds"] >= 0
    with served(tmp_path / "data", http=http) as (_, client):
        doc = client.get("/healthz/recovery").json()
        assert doc["clean_shutdown"] is True  # the last stop drained
        assert doc["last_start"] == "clean"
        assert doc["partitions"] >= 2
