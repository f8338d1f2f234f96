"""``tidewire log-level`` against a broker serving HTTP on port 0 (embedded, in a thread)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli._support import closed_port, run_cli
from tests.http._support import served
from tidewire.security.config import SecurityConfig


@pytest.fixture
def restore_levels() -> Iterator[None]:
    names = ["tidewire.storage", "tidewire.cli.test"]
    saved = {n: logging.getLogger(n).level for n in names}
    yield
    for n, level in saved.items():
        logging.getLogger(n).setLevel(level)


def test_show_and_set_levels(tmp_path: Path, restore_levels: None) -> None:
    with served(tmp_path / "data") as (eb, _):
        url = ["--http-url", eb.http_url]
        r = run_cli(["log-level", "tidewire.storage", "debug", *url])
        assert r.exit_code == 0, r.output
        assert r.output == "tidewire.storage: DEBUG (logs at DEBUG)\n"
        assert logging.getLogger("tidewire.storage").level == logging.DEBUG

        r = run_cli(["log-level", *url])
        assert r.exit_code == 0, r.output
        lines = r.output.splitlines()
        assert lines[0].split()[0] == "root"
        assert any(line.split()[:2] == ["tidewire.storage", "DEBUG"] for line in lines)

        r = run_cli(["log-level", "tidewire.storage", "--json", *url])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.output)
        assert doc["loggers"] == [
            {"logger": "tidewire.storage", "level": "DEBUG", "effective_level": "DEBUG"}
        ]
        # a logger no code has created yet: what it would inherit
        r = run_cli(["log-level", "tidewire.storage.never.made", "--json", *url])
        assert json.loads(r.output)["loggers"][0]["effective_level"] == "DEBUG"

        r = run_cli(["log-level", "tidewire.storage", "LOUD", *url])
        assert r.exit_code == 1
        assert "HTTP 422: log level 'LOUD' is not one of CRITICAL, ERROR, WARNING" in r.output
        assert logging.getLogger("tidewire.storage").level == logging.DEBUG


def test_needs_credentials_with_authentication_on(tmp_path: Path, restore_levels: None) -> None:
    security = SecurityConfig(authentication=True, superusers="admin")
    with served(tmp_path / "data", security=security) as (eb, _):
        url = ["--http-url", eb.http_url]
        r = run_cli(["log-level", *url])
        assert r.exit_code == 1
        assert "HTTP 401" in r.output
        key = (tmp_path / "data" / "bootstrap-admin.key").read_text().strip()
        r = run_cli(
            ["log-level", "tidewire.cli.test", "WARNING", *url], env={"TIDEWIRE_API_KEY": key}
        )
        assert r.exit_code == 0, r.output
        assert logging.getLogger("tidewire.cli.test").level == logging.WARNING


def test_an_unreachable_broker_is_named() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    r = run_cli(["log-level", "--http-url", url])
    assert r.exit_code == 1
    assert f"cannot reach {url}/v1/admin/log-levels" in r.output
