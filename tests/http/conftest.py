"""The ``client`` fixture: a broker serving the HTTP API, per test, always stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.http._support import api


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    """An httpx client of a broker with 2 partitions per auto-created topic."""
    with api(tmp_path / "data", default_partitions=2) as c:
        yield c
