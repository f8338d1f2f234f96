"""The HTTP API's request ids, spans, JSON log lines and run-time log levels, against a
broker serving HTTP on port 0 (the embedded mode)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.trace import SpanKind

from tests.http._support import error_of, served
from tests.observability._support import traced
from tidewire.observability import logs
from tidewire.security.config import SecurityConfig


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    with served(tmp_path / "data") as (_, c):
        yield c


@pytest.fixture
def restore_levels() -> Iterator[None]:
    """Put back the levels a test changes."""
    names = ["", "tidewire", "tidewire.storage", "tidewire.http"]
    saved = {n: logging.getLogger(n or None).level for n in names}
    yield
    for n, level in saved.items():
        logging.getLogger(n or None).setLevel(level)


def test_request_ids_are_echoed_or_generated(client: httpx.Client) -> None:
    r = client.get("/v1/topics", headers={"X-Request-Id": "req-42"})
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "req-42"
    generated = client.get("/v1/topics").headers["x-request-id"]
    assert len(generated) == 32
    assert client.get("/v1/topics").headers["x-request-id"] != generated
    # a value a log line should not carry is replaced
    hostile = client.get("/v1/topics", headers={"X-Request-Id": 'a"b{c}' + "x" * 200})
    assert len(hostile.headers["x-request-id"]) == 32
    # the publish fast path too
    r = client.post("/v1/topics/t/messages", json={"value": "v"}, headers={"X-Request-Id": "p1"})
    assert r.status_code in (200, 201), r.text
    assert r.headers["x-request-id"] == "p1"


def test_an_http_request_span(client: httpx.Client) -> None:
    with traced() as exporter:
        r = client.get("/v1/topics/nope", headers={"X-Request-Id": "s1"})
        assert r.status_code == 404
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        client.get("/v1/topics", headers={"traceparent": parent})
        spans = exporter.get_finished_spans()
    missing, listing = spans
    assert missing.name == "GET /v1/topics/{topic}"
    assert missing.kind is SpanKind.SERVER
    attrs = dict(missing.attributes or {})
    assert attrs["http.request.method"] == "GET"
    assert attrs["http.route"] == "/v1/topics/{topic}"
    assert attrs["http.response.status_code"] == 404
    assert attrs["url.path"] == "/v1/topics/nope"
    assert listing.name == "GET /v1/topics"
    assert listing.parent is not None  # it continues the caller's trace
    assert listing.context is not None
    assert f"{listing.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert f"{listing.parent.span_id:016x}" == "b7ad6b7169203331"


def test_no_span_without_an_sdk(client: httpx.Client) -> None:
    with traced() as exporter:
        pass
    client.get("/v1/topics")
    assert exporter.get_finished_spans() == ()


def test_log_levels_at_run_time(client: httpx.Client, restore_levels: None) -> None:
    r = client.get("/v1/admin/log-levels")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["levels"] == ["CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET"]
    assert doc["loggers"][0]["logger"] == "root"
    r = client.put("/v1/admin/log-levels", json={"logger": "tidewire.storage", "level": "debug"})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "logger": "tidewire.storage",
        "level": "DEBUG",
        "effective_level": "DEBUG",
    }
    assert logging.getLogger("tidewire.storage").level == logging.DEBUG
    listed = {d["logger"]: d for d in client.get("/v1/admin/log-levels").json()["loggers"]}
    assert listed["tidewire.storage"]["level"] == "DEBUG"

    # any logger, a library's too
    r = client.put("/v1/admin/log-levels", json={"logger": "tidewire-test.lib", "level": "ERROR"})
    assert r.status_code == 200, r.text
    assert r.json() == {"logger": "tidewire-test.lib", "level": "ERROR", "effective_level": "ERROR"}
    logging.getLogger("tidewire-test.lib").setLevel(logging.NOTSET)
    r = client.put("/v1/admin/log-levels", json={"logger": "root", "level": "INFO"})
    assert r.json()["logger"] == "root"

    r = client.put("/v1/admin/log-levels", json={"logger": "tidewire.storage", "level": "LOUD"})
    assert r.status_code == 422
    assert error_of(r)["message"] == (
        "log level 'LOUD' is not one of CRITICAL, ERROR, WARNING, INFO, DEBUG, NOTSET"
    )
    r = client.put("/v1/admin/log-levels", json={"logger": "a b", "level": "INFO"})
    assert r.status_code == 422
    assert "logger name 'a b'" in error_of(r)["message"]
    assert client.put("/v1/admin/log-levels", json={"level": "INFO"}).status_code == 400
    assert logging.getLogger("tidewire.storage").level == logging.DEBUG


def test_json_log_lines_carry_the_request_id(client: httpx.Client, restore_levels: None) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    lg = logging.getLogger("tidewire.http")
    lg.addHandler(handler)
    lg.setLevel(logging.INFO)
    try:
        r = client.put(
            "/v1/admin/log-levels",
            json={"logger": "tidewire.storage", "level": "WARNING"},
            headers={"X-Request-Id": "ops-7"},
        )
        assert r.status_code == 200, r.text
    finally:
        lg.removeHandler(handler)
    (line,) = out.getvalue().splitlines()
    doc = json.loads(line)
    assert doc["message"] == "log level of tidewire.storage set to WARNING"
    assert (doc["level"], doc["logger"]) == ("INFO", "tidewire.http")
    assert doc["request_id"] == "ops-7"
    assert doc["api"] == "PUT /v1/admin/log-levels"
    assert doc["ts"].endswith("Z")


def test_json_log_lines_name_the_principal(tmp_path: Path, restore_levels: None) -> None:
    security = SecurityConfig(authentication=True, superusers="admin")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    lg = logging.getLogger("tidewire.http")
    lg.addHandler(handler)
    lg.setLevel(logging.INFO)
    try:
        with served(tmp_path / "data", security=security) as (_, client):
            key = (tmp_path / "data" / "bootstrap-admin.key").read_text().strip()
            r = client.put(
                "/v1/admin/log-levels",
                json={"logger": "tidewire.storage", "level": "ERROR"},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert r.status_code == 200, r.text
            assert client.get("/v1/admin/log-levels").status_code == 401
    finally:
        lg.removeHandler(handler)
    (doc,) = [json.loads(line) for line in out.getvalue().splitlines() if "log level" in line]
    assert doc["principal"] == "admin"
    assert doc["request_id"] == r.headers["x-request-id"]
